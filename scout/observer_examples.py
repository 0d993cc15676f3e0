"""Worked examples of a round's assessment: ``spec/examples/observer.txt`` (spec/observer.md
rows 1-6 and COMPLETION-1..12).

Written for a reviewer who reads no Python. An example is a ``round`` line, one line per rank,
then the answer::

    round  # the issue's run-ahead hang, its group tracked
      0: host=(19, 2) contract=enqueue S=20/18:started:F
      1: host=(21, 5) contract=enqueue S=22/18:enqueued:F
      2: host=(21, 5) contract=enqueue S=22/18:started:F
      -> behind attributed=[1] blocking=19 group=S

A rank line: ``host=(step, op)``; optionally ``fp=NAME`` (the collective its host is inside),
``stage=collective|compute|data|ckpt``, ``contract=blocking|enqueue`` (default blocking),
``stale`` (its completion section went stale), ``idle=SECONDS`` (default 3); and one
``GROUP=ENQUEUED/COMPLETED[:STATE[:FP[:DONE_FP]]]`` per tracked group (``GROUP~=...``: its
point-to-point coordinate). ``missing`` instead of all that: the rank did not answer. Group and
fingerprint names are words; equal words are equal values. The answer names the finding, the
attributed and missing ranks, the blocking collective and its group, and a reason code where the
finding has one of its own. ``pytest --rewrite-examples`` rewrites the ``->`` lines.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator
from pathlib import Path

import attrs

from scout.core.observer import (
    Assessment,
    Completion,
    Evidence,
    HostContract,
    ObserverConfig,
    PendingState,
    Stage,
    assess,
)
from scout.reports.kinds import observer_reason

__all__ = ["OBSERVER_EXAMPLES_PATH", "ObserverExample", "actual_observer_line", "load_observer_examples",
           "rewrite_observer_examples"]

OBSERVER_EXAMPLES_PATH = Path(__file__).resolve().parent.parent / "spec" / "examples" / "observer.txt"
_STAGES = {"collective": Stage.COLLECTIVE, "compute": Stage.COMPUTE, "data": Stage.DATA_LOADING,
           "ckpt": Stage.CHECKPOINT_WRITE, "idle": Stage.IDLE}
_STATES = {"enqueued": PendingState.ENQUEUED, "started": PendingState.STARTED, "unknown": PendingState.UNKNOWN}
_RANK = re.compile(r"^(?P<position>\d+):\s*(?P<rest>.*)$")
_HOST = re.compile(r"host=\((?P<step>-?\d+),\s*(?P<op>\d+)\)")
_GROUP = re.compile(r"^(?P<name>[A-Za-z][\w]*)(?P<p2p>~?)=(?P<enqueued>\d+)/(?P<completed>\d+)(?::(?P<rest>.*))?$")
#: The examples' observer: thresholds that every example's idle times are past.
_CONFIG = dict(stall_threshold_s=2.0, settle_idle_s=1.0)


class ObserverExampleError(ValueError):
    """A line of the observer examples cannot be read; the message names the line."""


def _word(name: str) -> int:
    """A stable nonzero 64-bit value for a word (group or fingerprint name)."""
    return int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), "little") or 1


@attrs.frozen
class ObserverExample:
    line_number: int
    header: str
    ranks: tuple[str, ...]
    evidence: tuple[Evidence | None, ...]
    groups: tuple[tuple[str, int], ...]  # word -> source key, to render the answer
    expected: str | None

    def run(self) -> Assessment:
        return assess(list(self.evidence), ObserverConfig(0, len(self.evidence), **_CONFIG))  # type: ignore[arg-type]


def _completion(token: str, line_number: int) -> Completion:
    match = _GROUP.match(token)
    if match is None:
        raise ObserverExampleError(f"line {line_number}: cannot read group coordinate {token!r}")
    enqueued, completed = int(match["enqueued"]), int(match["completed"])
    parts = (match["rest"] or "").split(":") if match["rest"] else []
    state = PendingState.NONE
    fingerprint = done = 0
    if parts:
        if parts[0] not in _STATES:
            raise ObserverExampleError(f"line {line_number}: unknown state {parts[0]!r} in {token!r}")
        state = _STATES[parts[0]]
        fingerprint = _word(parts[1]) if len(parts) > 1 and parts[1] else 0
        done = _word(parts[2]) if len(parts) > 2 and parts[2] else 0
    try:
        return Completion(_word(match["name"] + ("~" if match["p2p"] else "")), enqueued, completed, fingerprint, state,
                          done, bool(match["p2p"]))
    except ValueError as error:
        raise ObserverExampleError(f"line {line_number}: {error}") from None


def _evidence(text: str, line_number: int) -> tuple[Evidence | None, list[str]]:
    text = text.split("#", 1)[0].strip()
    if text == "missing":
        return None, []
    host = _HOST.search(text)
    if host is None:
        raise ObserverExampleError(f"line {line_number}: a rank needs host=(step, op) or 'missing': {text!r}")
    rest = (text[:host.start()] + text[host.end():]).split()
    fingerprint, stage, contract, stale, idle = 0, Stage.COMPUTE, HostContract.BLOCKING, False, 3.0
    completions: list[Completion] = []
    names: list[str] = []
    for token in rest:
        key, _, value = token.partition("=")
        if key == "fp":
            fingerprint, stage = _word(value), Stage.COLLECTIVE
        elif key == "stage" and value in _STAGES:
            stage = _STAGES[value]
        elif key == "contract" and value in ("blocking", "enqueue"):
            contract = HostContract.BLOCKING if value == "blocking" else HostContract.ENQUEUE
        elif key == "idle":
            idle = float(value)
        elif token == "stale":
            stale = True
        else:
            completions.append(_completion(token, line_number))
            names.append(token.split("=", 1)[0])
    return Evidence(int(host["step"]), int(host["op"]), fingerprint, stage, idle, tuple(completions),
                    tuple(1.0 for _ in completions), contract, stale), names


def parse_observer_examples(text: str) -> Iterator[ObserverExample]:
    lines = text.splitlines()
    index = 0
    while index < len(lines):
        line = lines[index].strip()
        index += 1
        if not line or line.startswith("#"):
            continue
        if not line.startswith("round"):
            raise ObserverExampleError(f"line {index}: expected 'round', got {line!r}")
        header_line = index
        evidence: list[Evidence | None] = []
        ranks: list[str] = []
        words: dict[str, int] = {}
        while index < len(lines) and _RANK.match(lines[index].strip()):
            match = _RANK.match(lines[index].strip())
            assert match is not None
            index += 1
            if int(match["position"]) != len(evidence):
                raise ObserverExampleError(f"line {index}: ranks must be listed 0, 1, 2, ...")
            item, names = _evidence(match["rest"], index)
            evidence.append(item)
            ranks.append(lines[index - 1].strip())
            for name in names:
                words[name] = _word(name)
        if len(evidence) < 2:
            raise ObserverExampleError(f"line {header_line}: a round needs at least two ranks")
        expected = None
        if index < len(lines) and lines[index].strip().startswith("->"):
            expected = lines[index].strip()[2:].strip()
            index += 1
        yield ObserverExample(header_line, line, tuple(ranks), tuple(evidence), tuple(sorted(words.items())), expected)


def load_observer_examples(path: Path = OBSERVER_EXAMPLES_PATH) -> list[ObserverExample]:
    try:
        return list(parse_observer_examples(path.read_text(encoding="utf-8")))
    except ObserverExampleError as error:
        raise ObserverExampleError(f"{path}: {error}") from None


def actual_observer_line(example: ObserverExample) -> str:
    found = example.run()
    parts = [found.outcome.value]
    if found.attributed:
        parts.append(f"attributed={list(found.attributed)}")
    if found.missing:
        parts.append(f"missing={list(found.missing)}")
    if found.blocking:
        group = next((word for word, key in example.groups if key == found.source), f"{found.source:#x}")
        parts.append(f"blocking={found.blocking} group={group}")
    if found.code:
        parts.append(f"reason={observer_reason(found.outcome, found.attributed, found.ahead, code=found.code).value}")
    return " ".join(parts)


def rewrite_observer_examples(path: Path = OBSERVER_EXAMPLES_PATH) -> int:
    """Rewrite every '->' line with the current answer; returns how many changed."""
    lines = path.read_text(encoding="utf-8").splitlines()
    examples = {example.line_number: example for example in load_observer_examples(path)}
    out: list[str] = []
    changed = 0
    index = 0
    while index < len(lines):
        out.append(lines[index])
        index += 1
        example = examples.get(index)
        if example is None:
            continue
        while index < len(lines) and _RANK.match(lines[index].strip()):
            out.append(lines[index])
            index += 1
        new = f"  -> {actual_observer_line(example)}"
        if index < len(lines) and lines[index].strip().startswith("->"):
            changed += lines[index].strip() != new.strip()
            index += 1
        else:
            changed += 1
        out.append(new)
    path.write_text("\n".join(out) + "\n", encoding="utf-8")
    return changed
