"""What makes a replay reproducible on every peer (spec/replay.md REPLAY-4, REPLAY-5): the
deterministic-kernels scope and the fixed output gradient. Every recipe executor uses both."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

__all__ = ["NondeterministicReplay", "deterministic_algorithms", "fixed_cotangent"]


class NondeterministicReplay(RuntimeError):
    """A kernel without a deterministic implementation was called inside replay."""


@contextlib.contextmanager
def deterministic_algorithms(enabled: bool = True) -> Iterator[None]:
    """REPLAY-4: deterministic kernels for the block only; the previous settings come back."""
    if not enabled:
        yield
        return
    previous = torch.are_deterministic_algorithms_enabled()
    previous_warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    previous_cudnn = (torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark)
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
    try:
        yield
    except RuntimeError as exc:
        if "deterministic" in str(exc):
            raise NondeterministicReplay(str(exc)) from exc
        raise
    finally:
        torch.use_deterministic_algorithms(previous, warn_only=previous_warn_only)
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = previous_cudnn


def fixed_cotangent(output: torch.Tensor, index: int, seed: int) -> torch.Tensor:
    """REPLAY-5: the output gradient of the ``index``-th differentiable output, pseudo-random
    from ``seed + index`` and identical on every peer (zeros for a non-float output)."""
    if not (output.is_floating_point() or output.is_complex()):
        return torch.zeros_like(output)
    generator = torch.Generator(device=output.device)
    generator.manual_seed(seed + index)
    return torch.randn(output.shape, generator=generator, device=output.device, dtype=output.dtype)
