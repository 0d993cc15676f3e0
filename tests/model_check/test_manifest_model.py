"""A model of the manifest's storage under faults (spec/gate.md GATE-30, GATE-31), checked
against the real fold (scout/gate/fold.py) over many random gate runs.

The directory after the writer committed generation g is modelled as: the last three generations
(each a decoded gate state with its transition log), the trust log (one record per transition,
promotions with their certificate, each tagged with the generation that committed it) and the
head (g). A *single fault* removes or damages one of these: a generation file deleted or damaged
(a damaged file still names its generation; GATE-M2 proves damage is always detected), the head
deleted, the whole trust log deleted, one log record damaged. A *crash* leaves the trust log or
the head one commit behind (they are written after the generation). The reader's view is what
GATE-31 says it sees: the newest good generation, the older good ones, the surviving log records
and the lost generations (damaged files, the head and log records that name a generation newer
than the newest good one). Checked, at every generation of every run:

- any single fault: the folded reading keeps the property of tests/gate_storage.py -- nothing
  quarantined or superseded in truth is restorable, a lost newest generation fails closed;
- any crash point without a fault: the reading is exact and does not fail closed (a crash is
  never mistaken for a loss).

The same faults on real files, for the worked story and a few random runs, are
tests/unit/test_manifest_damage.py.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import attrs
import pytest

from scout.gate.fold import GenerationRecord, LogRecord, fold
from scout.gate.model import GateConfig, GateEvent, Persist, TrustChange
from scout.gate.step import initial_state, step
from tests.gate_storage import random_events, taint_without_quarantine, violations
from tests.gate_story import CONFIG, story

KEPT = 3


@attrs.frozen
class Storage:
    """What survives in the directory, in the terms of GATE-31."""

    generations: tuple[GenerationRecord, ...]  # good ones, newest first
    damaged: tuple[int, ...] = ()  # generation numbers of files that do not verify
    head: int | None = None
    log: tuple[LogRecord, ...] = ()


def history(config: GateConfig, events: Sequence[GateEvent]) -> tuple[list[GenerationRecord], list[LogRecord]]:
    state = initial_state(config)
    generations = [GenerationRecord(1, state, ())]
    log: list[LogRecord] = []
    transitions: list[tuple[int, TrustChange]] = []
    for event in events:
        state, effects = step(state, event)
        if not any(isinstance(effect, Persist) for effect in effects):
            continue
        generation = len(generations) + 1
        changes = [effect for effect in effects if isinstance(effect, TrustChange)]
        new = [(len(transitions) + 1 + index, change) for index, change in enumerate(changes)]
        transitions += new
        log += [LogRecord(sequence, generation, change) for sequence, change in new]
        generations.append(GenerationRecord(generation, state, tuple(transitions)))
    return generations, log


def read(storage: Storage):
    """The reader of GATE-31 on the modelled directory, then the real fold."""
    newest = storage.generations[0].generation if storage.generations else 0
    lost = [(number, "damaged file") for number in storage.damaged if number > newest]
    if storage.head is not None and storage.head > newest:
        lost.append((storage.head, "named by the head"))
    log_newest = max((record.generation for record in storage.log), default=0)
    if log_newest > newest:
        lost.append((log_newest, "named by the trust log"))
    if not storage.generations:
        return None
    return fold(storage.generations[0], storage.generations[1:], storage.log, lost)


def faults(storage: Storage) -> Iterator[tuple[str, Storage, bool]]:
    """(name, faulty storage, whether the newest generation is lost) for every single fault."""
    newest = storage.generations[0].generation
    for record in storage.generations:
        rest = tuple(r for r in storage.generations if r is not record)
        lost = record.generation == newest
        yield f"delete generation {record.generation}", attrs.evolve(storage, generations=rest), lost
        yield (f"damage generation {record.generation}",
               attrs.evolve(storage, generations=rest, damaged=(record.generation,)), lost)
    yield "delete head", attrs.evolve(storage, head=None), False
    yield "delete trust log", attrs.evolve(storage, log=()), False
    for index in range(len(storage.log)):
        yield (f"damage trust-log record {storage.log[index].sequence}",
               attrs.evolve(storage, log=storage.log[:index] + storage.log[index + 1 :]), False)


def check_run(config: GateConfig, events: Sequence[GateEvent], name: str) -> int:
    generations, log = history(config, events)
    checked = 0
    for index, committed in enumerate(generations):
        truth = committed.state
        g = committed.generation
        kept = tuple(reversed(generations[max(0, index + 1 - KEPT) : index + 1]))
        whole = Storage(kept, head=g, log=tuple(r for r in log if r.generation <= g))
        # Crash points: the log or the head (or both) one commit behind. Never a false loss.
        for crash, storage in (
            ("none", whole),
            ("log behind", attrs.evolve(whole, log=tuple(r for r in whole.log if r.generation < g))),
            ("head behind", attrs.evolve(whole, head=g - 1 or None)),
            ("both behind", attrs.evolve(whole, head=g - 1 or None, log=tuple(r for r in whole.log if r.generation < g))),
        ):
            folded = read(storage)
            assert folded is not None and folded.fail_closed is None and folded.state == truth, (name, g, crash)
            checked += 1
        if len(kept) == 1:
            continue  # generation 1 alone: deleting it leaves no manifest (the writer refuses)
        for fault, storage, newest_lost in faults(whole):
            folded = read(storage)
            assert folded is not None, (name, g, fault)
            problems = violations(folded.state, truth, fail_closed=folded.fail_closed, newest_lost=newest_lost)
            assert not problems, f"{name} generation {g}, {fault}: {problems}"
            checked += 1
    return checked


def test_GATE_30_31_model_story_and_taint_every_single_fault_at_every_generation() -> None:
    assert check_run(CONFIG, story(), "story") > 500
    assert check_run(CONFIG, taint_without_quarantine(), "taint") > 20


@pytest.mark.parametrize("seed", range(40))
def test_GATE_30_31_model_random_runs(seed: int) -> None:
    config, events = random_events(seed, length=45)
    assert check_run(config, events, f"random seed {seed}") > 0


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(40, 1040))
def test_GATE_30_31_model_random_runs_slow(seed: int) -> None:
    config, events = random_events(seed, length=60)
    assert check_run(config, events, f"random seed {seed}") > 0
