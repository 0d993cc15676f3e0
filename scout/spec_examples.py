"""Worked examples of the verdict rule: ``spec/examples/verdict.txt``.

The file is written for a reviewer who reads no Python. Each example is two lines::

    exact [100, 100, 500]
      -> ATTRIBUTED outliers=[2] healthy=100

    timing(kappa=3, absolute_floor_ms=0) [10, 10.1, 30]
      -> ...

Values are Python-like literals plus the bare words ``MISSING``, ``nan`` and ``inf``.
Lines starting with ``#`` are commentary. The tests compare each ``->`` line with what
:mod:`scout.core.verdict` answers; ``pytest --rewrite-examples`` rewrites them.
"""

from __future__ import annotations

import ast
import math
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs

from scout.core.verdict import (
    MISSING,
    TimingConfig,
    Verdict,
    classify_exact,
    classify_timing,
)

EXAMPLES_PATH = Path(__file__).resolve().parent.parent / "spec" / "examples" / "verdict.txt"

_HEADER = re.compile(r"^(?P<mode>exact|timing)(?:\((?P<config>[^)]*)\))?\s+(?P<values>\[.*\])\s*$")
_NAMES = {"MISSING": MISSING, "nan": math.nan, "inf": math.inf}


class ExampleSyntaxError(ValueError):
    """A line of the examples file cannot be read; the message names file and line."""


@attrs.frozen
class Example:
    line_number: int
    mode: str
    config_text: str
    values: tuple[Any, ...]
    expected: str | None  # None when the "->" line is absent (to be written by --rewrite)

    @property
    def header(self) -> str:
        config = f"({self.config_text})" if self.config_text else ""
        return f"{self.mode}{config} {_render_values(self.values)}"

    def run(self) -> Verdict:
        if self.mode == "exact":
            return classify_exact(self.values)
        return classify_timing(self.values, _parse_config(self.config_text, self.line_number))


def _literal(node: ast.AST, line_number: int) -> Any:
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name) and node.id in _NAMES:
        return _NAMES[node.id]
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_literal(node.operand, line_number)
    if isinstance(node, ast.Tuple):
        return tuple(_literal(e, line_number) for e in node.elts)
    if isinstance(node, ast.List):
        return [_literal(e, line_number) for e in node.elts]
    raise ExampleSyntaxError(f"line {line_number}: cannot read value {ast.unparse(node)!r}")


def parse_values(text: str, line_number: int = 0) -> tuple[Any, ...]:
    try:
        tree = ast.parse(text, mode="eval").body
    except SyntaxError as exc:
        raise ExampleSyntaxError(f"line {line_number}: {exc.msg} in {text!r}") from None
    if not isinstance(tree, ast.List):
        raise ExampleSyntaxError(f"line {line_number}: values must be a [list], got {text!r}")
    return tuple(_literal(e, line_number) for e in tree.elts)


def _parse_config(text: str, line_number: int) -> TimingConfig:
    fields: dict[str, float] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, _, value = part.partition("=")
        try:
            fields[name.strip()] = float(value)
        except ValueError:
            raise ExampleSyntaxError(f"line {line_number}: bad config entry {part!r}") from None
    try:
        return TimingConfig(**fields)
    except TypeError as exc:
        raise ExampleSyntaxError(f"line {line_number}: {exc}") from None


def _render_value(value: Any) -> str:
    if value is MISSING:
        return "MISSING"
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, tuple):
        return "(" + ", ".join(_render_value(v) for v in value) + ("," if len(value) == 1 else "") + ")"
    return repr(value)


def _render_values(values: tuple[Any, ...]) -> str:
    return "[" + ", ".join(_render_value(v) for v in values) + "]"


def _number(value: float) -> str:
    return f"{value:.6g}"


def render_verdict(verdict: Verdict, mode: str) -> str:
    """The one-line form used in the examples file and by ``scout demo``."""
    parts = [verdict.status.value]
    if verdict.outliers:
        parts.append(f"outliers={list(verdict.outliers)}")
    if verdict.reason is not None:
        parts.append(f"reason={verdict.reason.value}")
    if verdict.missing:
        parts.append(f"missing={list(verdict.missing)}")
    if verdict.invalid:
        parts.append(f"invalid={list(verdict.invalid)}")
    if mode == "exact" and verdict.healthy_value is not None:
        parts.append(f"healthy={_render_value(verdict.healthy_value)}")
    if mode == "timing" and verdict.threshold_ms is not None:
        parts.append(f"centre_ms={_number(verdict.healthy_value)}")
        parts.append(f"threshold_ms={_number(verdict.threshold_ms)}")
    return " ".join(parts)


def parse_examples(text: str) -> Iterator[Example]:
    lines = text.splitlines()
    index = 0
    while index < len(lines):
        line = lines[index].strip()
        index += 1
        if not line or line.startswith("#"):
            continue
        if line.startswith("->"):
            raise ExampleSyntaxError(f"line {index}: '->' without an example above it")
        match = _HEADER.match(line)
        if match is None:
            raise ExampleSyntaxError(
                f"line {index}: expected 'exact [..]' or 'timing(..) [..]', got {line!r}"
            )
        expected = None
        if index < len(lines) and lines[index].strip().startswith("->"):
            expected = lines[index].strip()[2:].strip()
            index += 1
        yield Example(
            line_number=index,
            mode=match["mode"],
            config_text=(match["config"] or "").strip(),
            values=parse_values(match["values"], index),
            expected=expected,
        )


def load_examples(path: Path = EXAMPLES_PATH) -> list[Example]:
    try:
        return list(parse_examples(path.read_text(encoding="utf-8")))
    except ExampleSyntaxError as exc:
        raise ExampleSyntaxError(f"{path}: {exc}") from None


def actual_line(example: Example) -> str:
    try:
        return render_verdict(example.run(), example.mode)
    except (TypeError, ValueError) as exc:
        return f"ERROR {type(exc).__name__}"


def rewrite_examples(path: Path = EXAMPLES_PATH) -> int:
    """Rewrite every '->' line with the current answer; returns how many changed."""
    lines = path.read_text(encoding="utf-8").splitlines()
    out: list[str] = []
    changed = 0
    index = 0
    while index < len(lines):
        raw = lines[index]
        out.append(raw)
        index += 1
        match = _HEADER.match(raw.strip())
        if not match or raw.strip().startswith("#"):
            continue
        example = next(parse_examples(raw.strip()))
        new = f"  -> {actual_line(example)}"
        if index < len(lines) and lines[index].strip().startswith("->"):
            if lines[index] != new:
                changed += 1
            index += 1
        else:
            changed += 1
        out.append(new)
    path.write_text("\n".join(out) + "\n", encoding="utf-8")
    return changed
