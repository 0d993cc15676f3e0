"""spec/examples/verdict.txt runs as tests: each '->' line is what scout answers.

`pytest --rewrite-examples` rewrites the expected lines (then review the diff like code).
"""

from __future__ import annotations

import pytest

from scout.spec_examples import EXAMPLES_PATH, actual_line, load_examples, rewrite_examples

EXAMPLES = load_examples()


def test_examples_file_is_not_empty_and_covers_both_modes() -> None:
    modes = {e.mode for e in EXAMPLES}
    assert modes == {"exact", "timing"} and len(EXAMPLES) >= 30


@pytest.mark.parametrize("example", EXAMPLES, ids=[f"line{e.line_number}" for e in EXAMPLES])
def test_VERDICT_worked_example(example, request: pytest.FixtureRequest) -> None:
    if request.config.getoption("--rewrite-examples"):
        pytest.skip("rewriting")
    assert example.expected is not None, f"{EXAMPLES_PATH}:{example.line_number} has no '->' line"
    assert actual_line(example) == example.expected, f"{EXAMPLES_PATH}:{example.line_number}"


def test_rewrite_flag(request: pytest.FixtureRequest) -> None:
    if not request.config.getoption("--rewrite-examples"):
        pytest.skip("pass --rewrite-examples to rewrite spec/examples/verdict.txt")
    rewrite_examples()


# The required behaviours, stated once more as plain asserts so that an edit of the
# examples file cannot silently drop them.
def test_required_behaviours_are_in_the_examples() -> None:
    lines = {e.header: e.expected for e in EXAMPLES}
    assert lines["exact [100, 100, 500]"].startswith("ATTRIBUTED outliers=[2]")
    assert lines["timing [100, 100, 500]"].startswith("ATTRIBUTED outliers=[2]")
    assert lines["timing [100, 100, 100, 500, 500]"].startswith("ATTRIBUTED outliers=[3, 4]")
    assert lines["exact [100, 100, 100, 500, 500]"].startswith("ATTRIBUTED outliers=[3, 4]")
    assert lines["timing [100, 500]"].startswith("INCONCLUSIVE")
    assert lines["exact [100, 500]"].startswith("INCONCLUSIVE")
    assert lines["timing [100, 100, 100, inf]"].startswith("ATTRIBUTED outliers=[3]")
    assert lines["timing [10, 10.01, nan, 9.99, 50]"].startswith("ATTRIBUTED outliers=[4]")
