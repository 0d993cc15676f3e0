"""The simulated job's storage (``scout.scenarios.replay_job``): every rank's checkpoint files and
rank 0's manifest, kept across the job's attempts, and the storage faults injected into them. As
the simulator replaces the network, this replaces the disk: the restore and save programs
(``scout.job.restore``, ``scout.job.save``) run unchanged and are passed these files' functions
instead of DCP's.

* :class:`SimFiles` holds, per rank, the checkpoints written there (checkpoint -> the step it
  holds). :meth:`SimFiles.restore_files` and :meth:`SimFiles.save_files` give one rank's
  functions for one attempt.
* :class:`AttemptRecorder` commits rank 0's gate states into the job's one
  :class:`~scout.gate.recorder.MemoryRecorder` (the manifest, kept across attempts).

The faults, each in one attempt only (a fault of the files, not of the job: the next attempt of a
save at that step writes):

* :class:`FilesGone` -- before an attempt begins, the files of the checkpoints its restore chooses
  are gone on some ranks (a retention script, an operator's ``rm``): the first ``count`` distinct
  checkpoints chosen lose their files on ``ranks`` (spec/recovery.md RECOVERY-7);
* :class:`WriteFails` -- one rank's write of the checkpoint of a step raises (a full or failed
  disk: what DCP raises on that rank; spec/gate.md GATE-40);
* :class:`NoSpace` -- rank 0's free-space check before the save of a step finds too little;
* :class:`ManifestFails` -- rank 0's commit of the capture of a step to the manifest raises.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

import attrs

from scout.gate.dcp import checkpoint_path
from scout.gate.model import CheckpointId
from scout.gate.recorder import MemoryRecorder
from scout.job.gate_driver import RestoreDecision
from scout.job.restore import RestoreFiles
from scout.job.save import SaveFiles

__all__ = ["AttemptRecorder", "FilesGone", "ManifestFails", "NoSpace", "SimFiles", "StorageFault", "WriteFails"]

#: Where the simulated job's checkpoints and manifest are (names only: nothing is written).
CHECKPOINT_ROOT: Final = "/sim/ckpt"
MANIFEST_PATH: Final = "/sim/run/gate"
#: What a failed write raises (errno 28), as a full disk makes DCP's writer raise on that rank.
NO_SPACE: Final = "No space left on device"


@attrs.frozen
class FilesGone:
    """Before ``attempt`` begins, the first ``count`` checkpoints its restore chooses have no files
    on ``ranks``."""

    attempt: int
    count: int
    ranks: tuple[int, ...]

    def describe(self) -> str:
        return (f"attempt {self.attempt}: the files of the first {self.count} checkpoint(s) its restore chooses "
                f"are gone on rank(s) {list(self.ranks)}")


@attrs.frozen
class WriteFails:
    """``rank``'s write of the checkpoint of ``step`` raises, in ``attempt``."""

    rank: int
    step: int
    attempt: int = 0

    def describe(self) -> str:
        return f"attempt {self.attempt}: rank {self.rank}'s write of the checkpoint of step {self.step} fails ({NO_SPACE})"


@attrs.frozen
class NoSpace:
    """Rank 0's free-space check before the save of ``step`` finds too little, in ``attempt``."""

    step: int
    attempt: int = 0

    def describe(self) -> str:
        return f"attempt {self.attempt}: too little free space for the checkpoint of step {self.step}"


@attrs.frozen
class ManifestFails:
    """Rank 0's commit of the capture of ``step`` to the manifest raises, in ``attempt``."""

    step: int
    attempt: int = 0

    def describe(self) -> str:
        return f"attempt {self.attempt}: the manifest's commit of the capture of step {self.step} fails"


StorageFault = FilesGone | WriteFails | NoSpace | ManifestFails


def _where(checkpoint: CheckpointId) -> str:
    return str(checkpoint_path(CHECKPOINT_ROOT, checkpoint))


class SimFiles:
    """Every rank's checkpoint files, kept across attempts (module docstring)."""

    def __init__(self, ranks: int, faults: Sequence[StorageFault] = ()) -> None:
        if ranks < 1:
            raise ValueError(f"ranks must be >= 1, got {ranks}")
        for fault in faults:
            named = fault.ranks if isinstance(fault, FilesGone) else (fault.rank,) if isinstance(fault, WriteFails) else ()
            if any(not 0 <= rank < ranks for rank in named):
                raise ValueError(f"{fault!r} names a rank outside 0..{ranks - 1}")
        self.held: list[dict[CheckpointId, int]] = [{} for _ in range(ranks)]
        self.faults = tuple(faults)
        #: FilesGone: the checkpoints whose files went, by attempt (in the order chosen).
        self.gone: dict[int, list[CheckpointId]] = {}
        #: How many writes were made, by rank (every rank writes its part of every save).
        self.writes = [0] * ranks

    def restore_files(self, rank: int, attempt: int) -> RestoreFiles:
        def missing(decision: RestoreDecision) -> str | None:
            assert decision.checkpoint is not None  # the restore program asks about a chosen checkpoint
            self._lose_if_chosen(attempt, decision.checkpoint)
            if decision.checkpoint in self.held[rank]:
                return None
            return f"{_where(decision.checkpoint)} holds no complete checkpoint on rank {rank}"

        def load(checkpoint: CheckpointId) -> int:
            if checkpoint not in self.held[rank]:
                raise FileNotFoundError(f"{_where(checkpoint)}: no checkpoint on rank {rank}")
            return self.held[rank][checkpoint]

        return RestoreFiles(CHECKPOINT_ROOT, _where, missing, load)

    def save_files(self, rank: int, attempt: int) -> SaveFiles:
        def free_space(checkpoint: CheckpointId) -> str | None:
            if any(isinstance(f, NoSpace) and (f.attempt, f.step) == (attempt, checkpoint.step) for f in self.faults):
                return (f"not enough free space: 0 bytes free in {CHECKPOINT_ROOT}, and this rank's share of the "
                        "state alone is 1 bytes; free space, then restart")
            return None

        def save(checkpoint: CheckpointId) -> None:
            self.writes[rank] += 1
            if any(isinstance(f, WriteFails) and (f.attempt, f.rank, f.step) == (attempt, rank, checkpoint.step)
                   for f in self.faults):
                raise OSError(28, NO_SPACE, _where(checkpoint))
            self.held[rank][checkpoint] = checkpoint.step

        return SaveFiles(_where, MANIFEST_PATH, free_space, save)

    def _lose_if_chosen(self, attempt: int, checkpoint: CheckpointId) -> None:
        """FilesGone: the first ``count`` distinct checkpoints chosen in ``attempt`` lose their
        files on the fault's ranks. Every rank asks about the same checkpoint in the same round,
        so whichever asks first removes them for all, and the others see them gone."""
        for fault in self.faults:
            if not isinstance(fault, FilesGone) or fault.attempt != attempt:
                continue
            gone = self.gone.setdefault(attempt, [])
            if checkpoint not in gone and len(gone) < fault.count:
                gone.append(checkpoint)
                for rank in fault.ranks:
                    self.held[rank].pop(checkpoint, None)

    def manifest_fails(self, attempt: int) -> tuple[int, ...]:
        """ManifestFails: the steps whose capture rank 0 cannot commit in ``attempt``."""
        return tuple(f.step for f in self.faults if isinstance(f, ManifestFails) and f.attempt == attempt)


class AttemptRecorder:
    """Rank 0's recorder in one attempt: commits into the job's manifest (``storage``), except
    the capture of a step in ``failing_captures``, whose commit raises (ManifestFails) and leaves
    the manifest as it was."""

    fail_closed: str | None = None  # GATE-31: the simulated manifest never lost a generation

    def __init__(self, storage: MemoryRecorder, failing_captures: Sequence[int] = ()) -> None:
        self.storage = storage
        self.failing_captures = frozenset(failing_captures)

    def record(self, state: Any, effects: Sequence[object]) -> int | None:
        captured = state.context.last_capture_step
        before = self.storage.generations[-1].context.last_capture_step if self.storage.generations else None
        if captured in self.failing_captures and captured != before:
            raise OSError(28, NO_SPACE, f"{MANIFEST_PATH}: the commit of the capture of step {captured}")
        return self.storage.record(state, effects)

    def close(self) -> None:
        self.storage.close()
