"""RNG state for replay (spec/replay.md CAP-3, REPLAY-2).

A module that draws random numbers (dropout) replays identically on every peer only if every
peer starts from the same generator state. The state is captured in the forward pre-hook --
exactly the state the live call consumed -- broadcast from the source peer, installed for the
replay only, and each peer's own state restored afterwards.

Covered: the CPU generator and the generator of the captured module's accelerator (CUDA).
Python's ``random`` and NumPy's global generators are not captured; a module that draws from
them replays differently on every peer and is reported Inconclusive (nondeterministic),
never as corruption.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import attrs
import torch

__all__ = ["RngState", "capture_rng_state", "installed_rng_state"]


@attrs.frozen(eq=False)
class RngState:
    """Generator states as uint8 tensors (so that they travel by tensor broadcast)."""

    cpu: torch.Tensor
    accelerator_type: str | None = None  # "cuda" or None
    accelerator_index: int | None = None
    accelerator: torch.Tensor | None = None

    def tensors(self) -> list[torch.Tensor]:
        """The tensors to broadcast, in a fixed order."""
        return [self.cpu] if self.accelerator is None else [self.cpu, self.accelerator]

    def as_structure(self) -> dict[str, object]:
        """For ``structured_signature`` and readiness descriptions (device index excluded:
        peers sit on different device indices)."""
        return {
            "cpu": self.cpu,
            "accelerator_type": self.accelerator_type,
            "accelerator": self.accelerator,
        }

    def clone(self) -> RngState:
        return RngState(
            self.cpu.clone(),
            self.accelerator_type,
            self.accelerator_index,
            None if self.accelerator is None else self.accelerator.clone(),
        )


def capture_rng_state(device: torch.device | None = None) -> RngState:
    """The CPU state, plus the CUDA state of ``device`` when it is a CUDA device."""
    cpu = torch.get_rng_state()
    if device is not None and device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        return RngState(cpu, "cuda", index, torch.cuda.get_rng_state(index))
    return RngState(cpu)


@contextlib.contextmanager
def installed_rng_state(state: RngState) -> Iterator[None]:
    """Install ``state`` for the duration of the block; restore this process's own after."""
    devices = [state.accelerator_index] if state.accelerator_type == "cuda" else []
    with torch.random.fork_rng(devices=devices, enabled=True):
        torch.set_rng_state(state.cpu)
        if state.accelerator is not None and state.accelerator_type == "cuda":
            torch.cuda.set_rng_state(
                state.accelerator,
                "cuda" if state.accelerator_index is None else state.accelerator_index,
            )
        yield
