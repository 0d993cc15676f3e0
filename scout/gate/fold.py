"""Fold every surviving manifest record into one gate state, failing closed (spec/gate.md
GATE-30..32). Pure: the manifest (:mod:`scout.gate.manifest`) reads the files, the recorder
(:mod:`scout.gate.recorder`) decodes them and calls :func:`fold`.

Every trust transition is on disk twice: in the generation that committed it (its whole
trust-transition log) and in the append-only trust log. The rules:

- GATE-30: a checkpoint that *any* surviving record shows QUARANTINED (or SUPERSEDED, or LOST)
  is QUARANTINED (SUPERSEDED, LOST) in the folded state, whatever the newest generation says.
  Absorbing trust is absorbing across storage faults too.
- GATE-31: if the newest generation is lost (named by a damaged file, the head or the trust log,
  but not held by any good file), or the newest good generation contradicts another record
  (it forgets a checkpoint, or the trust log holds a transition it lacks), the reader fails
  closed: every CAPTURED and CANDIDATE checkpoint is read as QUARANTINED with a reason naming
  the lost generation, so only RECOVERY_VERIFIED checkpoints (or initialization) can be chosen.
  A promotion the trust log holds from the lost generation counts if its certificate holds.

The result lists every trust change the fold made, so a writer that resumes can commit them to
the transition log (GATE-32), and a reader can say why (``fail_closed``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

import attrs

from scout.core.machine import MachineState
from scout.gate.model import (
    RESTORABLE,
    UNVERIFIED_RESTORABLE,
    Certificate,
    CheckpointEntry,
    CheckpointId,
    GateConfig,
    GateContext,
    Trust,
    TrustChange,
    is_complete_and_clean,
)

__all__ = ["Folded", "GenerationRecord", "LogRecord", "certificate_holds", "fold"]

GateMachineState = MachineState[GateContext]

# QUARANTINED outranks SUPERSEDED, which outranks LOST: all three are never restored; the SDC
# reason is the one to keep. LOST (GATE-42) is absorbing across storage faults like the others: a
# lost verified checkpoint must not come back from an older generation that still shows it verified.
_ABSORBING_RANK: Final = {Trust.QUARANTINED: 3, Trust.SUPERSEDED: 2, Trust.LOST: 1}


@attrs.frozen
class GenerationRecord:
    """One verified, decoded generation: its gate state and its trust-transition log."""

    generation: int
    state: GateMachineState
    transitions: tuple[tuple[int, TrustChange], ...]


@attrs.frozen
class LogRecord:
    """One verified trust-log record: the transition with its sequence number and the
    generation that committed it (promotions carry their certificate)."""

    sequence: int
    generation: int
    change: TrustChange


@attrs.frozen
class Folded:
    """The folded state, the trust changes the fold made (in order), and why the reader failed
    closed (None when it did not)."""

    state: GateMachineState
    changes: tuple[TrustChange, ...]
    fail_closed: str | None
    notes: tuple[str, ...] = ()


def certificate_holds(certificate: Certificate, checkpoint: CheckpointId, config: GateConfig) -> bool:
    """The certificate is this checkpoint's, its two cycles are complete and clean for the
    job's catalog and groups, and they meet at the checkpoint's step (GATE-8)."""
    return (
        certificate.checkpoint == checkpoint
        and certificate.recipes == config.recipe_ids
        and certificate.groups == config.groups
        and is_complete_and_clean(config, certificate.before)
        and is_complete_and_clean(config, certificate.after)
        and certificate.before.end_step == checkpoint.step == certificate.after.start_step
    )


def _absorbing_facts(
    newest: GenerationRecord, older: Sequence[GenerationRecord], log: Sequence[LogRecord]
) -> dict[CheckpointId, tuple[Trust, str]]:
    facts: dict[CheckpointId, tuple[Trust, str]] = {}

    def note(checkpoint: CheckpointId, trust: Trust, source: str) -> None:
        if trust not in _ABSORBING_RANK:
            return
        have = facts.get(checkpoint)
        if have is None or _ABSORBING_RANK[trust] > _ABSORBING_RANK[have[0]]:
            facts[checkpoint] = (trust, source)

    for record in older:
        for entry in record.state.context.checkpoints:
            note(entry.id, entry.trust, f"generation {record.generation}")
        for sequence, change in record.transitions:
            note(change.checkpoint, change.after, f"transition {sequence} of generation {record.generation}")
    for sequence, change in newest.transitions:
        note(change.checkpoint, change.after, f"transition {sequence} of generation {newest.generation}")
    for item in log:
        note(item.change.checkpoint, item.change.after, f"trust-log record {item.sequence} (generation {item.generation})")
    return facts


def fold(
    newest: GenerationRecord,
    older: Sequence[GenerationRecord] = (),
    log: Sequence[LogRecord] = (),
    lost: Sequence[tuple[int, str]] = (),
) -> Folded:
    """Fold the newest good generation with every other surviving record (GATE-30) and fail
    closed if a generation is lost or the records contradict each other (GATE-31)."""
    context = newest.state.context
    config = context.config
    entries: dict[CheckpointId, CheckpointEntry] = {entry.id: entry for entry in context.checkpoints}
    changes: list[TrustChange] = []
    notes: list[str] = []
    lost_reasons = [f"generation {generation}: {why}" for generation, why in lost]

    def retrust(checkpoint: CheckpointId, trust: Trust, reason: str, certificate: Certificate | None = None) -> None:
        entry = entries.get(checkpoint)
        entries[checkpoint] = CheckpointEntry(checkpoint, trust, reason, None, certificate)
        changes.append(TrustChange(checkpoint, None if entry is None else entry.trust, trust, reason, certificate))

    # GATE-2 across generations: an entry an older generation holds is never forgotten.
    for record in older:
        for forgotten in record.state.context.checkpoints:
            if forgotten.id not in entries:
                lost_reasons.append(
                    f"generation {newest.generation} forgets checkpoint {forgotten.id}, which generation "
                    f"{record.generation} records as {forgotten.trust.value}"
                )
                retrust(forgotten.id, forgotten.trust,
                        f"{forgotten.reason} (recorded by generation {record.generation} only)",
                        forgotten.certificate if forgotten.trust is Trust.RECOVERY_VERIFIED else None)

    # GATE-30: absorbing trust from every surviving record.
    for checkpoint, (trust, source) in _absorbing_facts(newest, older, log).items():
        entry = entries.get(checkpoint)
        if entry is None:
            retrust(checkpoint, trust, f"{trust.value.lower()}: recorded by {source}; absent from generation "
                                       f"{newest.generation} (GATE-30)")
        elif entry.trust in RESTORABLE:
            retrust(checkpoint, trust, f"{trust.value.lower()}: recorded by {source}, although generation "
                                       f"{newest.generation} says {entry.trust.value}; absorbing trust survives "
                                       "storage faults (GATE-30)")

    # Trust-log records newer than the newest generation's log: the commits of lost generations.
    known = max((sequence for sequence, _change in newest.transitions), default=0)
    beyond = sorted((item for item in log if item.sequence > known), key=lambda item: item.sequence)
    if beyond and not lost_reasons:
        lost_reasons.append(
            f"the trust log holds transition {beyond[0].sequence} (generation {beyond[0].generation}), which "
            f"generation {newest.generation} lacks"
        )
    for item in beyond:
        change = item.change
        entry = entries.get(change.checkpoint)
        if change.after is Trust.RECOVERY_VERIFIED:
            verified_step = max((e.id.step for e in entries.values() if e.trust is Trust.RECOVERY_VERIFIED), default=-1)
            usable = (
                entry is not None
                and entry.trust in UNVERIFIED_RESTORABLE
                and change.certificate is not None
                and certificate_holds(change.certificate, change.checkpoint, config)
                and change.checkpoint.step > verified_step
            )
            if usable:
                retrust(change.checkpoint, Trust.RECOVERY_VERIFIED,
                        f"{change.reason} (from trust-log record {item.sequence}; its generation "
                        f"{item.generation} is lost)", change.certificate)
            else:
                notes.append(f"trust-log record {item.sequence}: promotion of {change.checkpoint} not used "
                             "(no holding certificate, or not restorable, or not newer than the verified one)")
        elif change.after in UNVERIFIED_RESTORABLE and entry is None:
            retrust(change.checkpoint, change.after, f"{change.reason} (from trust-log record {item.sequence})")

    fail_closed: str | None = None
    if lost_reasons:
        fail_closed = "; ".join(lost_reasons)
        reason = (
            f"fail-closed: the newest manifest generation is lost or contradicted ({fail_closed}); what it "
            "recorded is unknown, so only RECOVERY_VERIFIED checkpoints stay restorable (GATE-31)"
        )
        for checkpoint, entry in list(entries.items()):
            if entry.trust in UNVERIFIED_RESTORABLE:
                retrust(checkpoint, Trust.QUARANTINED, reason)
    folded = MachineState(newest.state.control, context.replace(checkpoints=tuple(entries.values())))
    return Folded(folded, tuple(changes), fail_closed, tuple(notes))
