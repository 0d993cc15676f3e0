"""spec/examples/observer.txt runs as tests: each '->' line is what a round's assessment answers
(spec/observer.md rows 1-6, COMPLETION-1..12). `pytest --rewrite-examples` rewrites them."""

from __future__ import annotations

import pytest

from scout.observer_examples import (
    OBSERVER_EXAMPLES_PATH,
    actual_observer_line,
    load_observer_examples,
    rewrite_observer_examples,
)

EXAMPLES = load_observer_examples()


@pytest.mark.parametrize("example", EXAMPLES, ids=[f"line{e.line_number}" for e in EXAMPLES])
def test_COMPLETION_worked_example(example, request: pytest.FixtureRequest) -> None:  # type: ignore[no-untyped-def]
    if request.config.getoption("--rewrite-examples"):
        pytest.skip("rewriting")
    assert example.expected is not None, f"{OBSERVER_EXAMPLES_PATH}:{example.line_number} has no '->' line"
    assert actual_observer_line(example) == example.expected, f"{OBSERVER_EXAMPLES_PATH}:{example.line_number}"


def test_rewrite_flag(request: pytest.FixtureRequest) -> None:
    if not request.config.getoption("--rewrite-examples"):
        pytest.skip("pass --rewrite-examples to rewrite spec/examples/observer.txt")
    rewrite_observer_examples()


def test_COMPLETION_9_the_issues_two_rounds_are_in_the_examples() -> None:
    """An edit of the file cannot silently drop the rule's two sides: the untracked run-ahead hang
    names nobody, the tracked one names the stalled rank."""
    answers = [e.expected for e in EXAMPLES]
    assert "inconclusive reason=host-progress-only" in answers
    assert "behind attributed=[1] blocking=19 group=S" in answers
    assert len(EXAMPLES) >= 12
