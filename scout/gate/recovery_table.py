"""GENERATED from spec/recovery.toml by `scout spec`. Do not edit: edit the table and rerun.

Rows of the recovery decision, in order; the first whose conditions hold decides. Each row:
(number, failures (empty: any), sdc_since_restart, verified, latest, emergency_replay,
choose, reason, why); None matches any value.
"""

from __future__ import annotations

from typing import Final

RowLiteral = tuple[int, tuple[str, ...], bool | None, bool | None, bool | None, str | None, str, str, str]

FAILURES: Final[tuple[str, ...]] = ('sdc', 'inaccessible', 'straggler', 'hang', 'data-stall', 'checkpoint-stall', 'uncertain')

ROWS: Final[tuple[RowLiteral, ...]] = (
    (1, ('sdc',), None, True, None, None, 'verified', 'sdc-restore-verified', 'RECOVERY-1: corruption was seen; only a checkpoint bracketed by two clean cycles predates it'),
    (2, ('sdc',), None, None, None, None, 'none', 'sdc-nothing-verified', 'RECOVERY-1: corruption was seen and nothing is verified; every unverified checkpoint is quarantined'),
    (3, (), True, True, None, None, 'verified', 'tainted-restore-verified', 'RECOVERY-2: whatever failed now, an SDC earlier in this run rules out every unverified checkpoint'),
    (4, (), True, None, None, None, 'none', 'tainted-nothing-verified', 'RECOVERY-2: an SDC earlier in this run and nothing verified: start from initialization'),
    (5, ('hang', 'inaccessible', 'uncertain'), None, None, True, 'clean', 'latest', 'emergency-replay-clean', 'RECOVERY-3: a full-catalog replay after the failure agreed everywhere, so no corruption is held'),
    (6, ('hang', 'inaccessible', 'uncertain'), None, True, None, None, 'verified', 'corruption-not-excluded', 'RECOVERY-3: failing hardware often corrupts before it stops; the newest state was not re-checked'),
    (7, ('hang', 'inaccessible', 'uncertain'), None, None, None, None, 'none', 'corruption-not-excluded-nothing-verified', 'RECOVERY-3: corruption cannot be excluded and nothing is verified: start from initialization'),
    (8, ('straggler', 'data-stall', 'checkpoint-stall'), None, None, True, None, 'latest', 'no-numerical-fault', 'RECOVERY-4: slowness and stalls say nothing about numbers; keep the most work'),
    (9, ('straggler', 'data-stall', 'checkpoint-stall'), None, True, None, None, 'verified', 'newest-restorable-is-verified', 'RECOVERY-4: no unverified checkpoint is newer than the verified one'),
    (10, ('straggler', 'data-stall', 'checkpoint-stall'), None, None, None, None, 'none', 'nothing-to-restore', 'RECOVERY-4: no restorable checkpoint exists yet'),
)
