"""Loading a machine table: every bad input is refused with an error naming the file and the
offending value (docs/spec-format.md, "Validation")."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from scout.core.machine import Actions, SpecError, build_machine, load_machine, load_table
from tests import processes
from tests.model_check.toy import TOY_TABLE_PATH, write_toy_variant
from tests.model_check.toy import actions as toy

pytestmark = pytest.mark.spawns

ROW_4 = 'source = "DONE"\ntrigger = "tick"\ndest = "DONE"\nwhy = "TOY-2: ticks after the report change nothing, so no second report"\n'

# (test id, text in toy.toml, replacement, values the error must name)
BAD_TABLES = [
    (
        "unknown_dest_state",
        'dest = "DONE"\neffect = "report"',
        'dest = "FINISHED"\neffect = "report"',
        ["FINISHED", "row 3"],
    ),
    (
        "unknown_source_state",
        'source = "IDLE"\ntrigger = "tick"',
        'source = "IDLING"\ntrigger = "tick"',
        ["IDLING", "row 1"],
    ),
    (
        "unknown_trigger",
        'trigger = "reset"\ndest = "IDLE"\nwhy = "nothing',
        'trigger = "rest"\ndest = "IDLE"\nwhy = "nothing',
        ["'rest'", "row 5"],
    ),
    ("unknown_initial", 'initial = "IDLE"', 'initial = "START"', ["'START'", "initial"]),
    (
        "unknown_guard",
        'guard = "at_limit"',
        'guard = "at_lmit"',
        ["'at_lmit'", "row 3", "tests.model_check.toy.actions"],
    ),
    ("malformed_guard", 'guard = "at_limit"', 'guard = "at limit"', ["'at limit'", "row 3"]),
    ("unknown_effect", 'effect = "report"', 'effect = "repor"', ["'repor'", "row 3"]),
    (
        "unknown_predicate",
        'predicate = "limit_reached"',
        'predicate = "limit_reachd"',
        ["'limit_reachd'", "TOY-3"],
    ),
    ("duplicate_invariant_id", 'id = "TOY-4"', 'id = "TOY-3"', ["duplicate id 'TOY-3'"]),
    ("malformed_invariant_id", 'id = "TOY-1"', 'id = "toy1"', ["'toy1'", "OBS-3"]),
    ("bad_invariant_kind", 'kind = "sometimes"', 'kind = "eventually"', ["'eventually'", "TOY-3"]),
    ("bad_invariant_scope", 'scope = "step"', 'scope = "trace"', ["'trace'", "TOY-2"]),
    (
        "unreachable_state",
        'DONE = "the limit',
        'ORPHAN = "never entered"\nDONE = "the limit',
        ["ORPHAN", "unreachable"],
    ),
    (
        "unused_event",
        'reset = "abandon',
        'pause = "never sent"\nreset = "abandon',
        ["pause", "no row uses"],
    ),
    ("state_without_meaning", 'IDLE = "no count in progress"', 'IDLE = ""', ["IDLE", "meaning"]),
    ("missing_initial", 'initial = "IDLE"\n', "", ["[machine]", "missing 'initial'"]),
    ("missing_why", 'why = "nothing to abandon"\n', "", ["row 5", "'why'"]),
    ("misspelt_key", 'guard = "at_limit"', 'gaurd = "at_limit"', ["'gaurd'", "row 3"]),
    ("unknown_top_level_table", "[states]", "[states]\n[extra]\n", ["'extra'"]),
    (
        "two_unguarded_rows_for_one_event",
        ROW_4,
        ROW_4 + "\n[[transition]]\n" + ROW_4,
        ["rows 4, 5", "no guard"],
    ),
    (
        "same_guard_twice",
        'guard = "at_limit"',
        'guard = "!at_limit"',
        ["rows 2 and 3", "'!at_limit'"],
    ),
    ("name_differs_from_file", 'name = "toy"', 'name = "toys"', ["'toys'", "toys.toml"]),
    (
        "actions_not_importable",
        'actions = "tests.model_check.toy.actions"',
        'actions = "tests.model_check.toy.missing"',
        ["tests.model_check.toy.missing", "cannot be imported"],
    ),
    (
        "actions_module_without_registry",
        'actions = "tests.model_check.toy.actions"',
        'actions = "tests.model_check.toy"',
        ["ACTIONS", "'tests.model_check.toy'"],
    ),
    ("not_toml", "[machine]", "[machine", ["not valid TOML"]),
]


@pytest.mark.parametrize(
    ("old", "new", "named"), [case[1:] for case in BAD_TABLES], ids=[case[0] for case in BAD_TABLES]
)
def test_bad_table_is_refused_naming_file_and_value(
    tmp_path: Path, old: str, new: str, named: list[str]
) -> None:
    path = write_toy_variant(tmp_path, old, new)
    with pytest.raises(SpecError) as error:
        load_machine(path)
    message = str(error.value)
    assert str(path) in message
    for value in named:
        assert value in message


def test_all_problems_of_a_table_are_reported_at_once(tmp_path: Path) -> None:
    path = write_toy_variant(
        tmp_path, 'dest = "DONE"\neffect = "report"', 'dest = "FINISHED"\neffect = "report"'
    )
    path.write_text(path.read_text().replace('initial = "IDLE"', 'initial = "START"'))
    message = str(pytest.raises(SpecError, load_table, path).value)
    assert "FINISHED" in message and "START" in message


def test_toy_table_loads_with_its_rows_states_and_invariants_in_file_order() -> None:
    machine = load_machine(TOY_TABLE_PATH)
    table = machine.table
    assert table.name == "toy" and table.initial == "IDLE"
    assert table.state_names == ("IDLE", "COUNTING", "DONE")
    assert table.triggers == ("tick", "reset")
    assert [row.number for row in table.rows] == list(range(1, 8))
    assert [str(row.guard) if row.guard else "" for row in table.rows[1:3]] == [
        "!at_limit",
        "at_limit",
    ]
    assert [row.ignores for row in table.rows] == [False, False, False, True, True, False, False]
    assert [(p.id, p.kind, p.scope) for p in machine.properties] == [
        ("TOY-1", "always", "state"),
        ("TOY-2", "always", "step"),
        ("TOY-3", "sometimes", "state"),
        ("TOY-4", "sometimes", "step"),
    ]


def _toy_actions(
    *, replace: dict[str, object] | None = None, extra_guards: tuple[object, ...] = ()
) -> Actions:
    """A registry with the toy's functions, some swapped, for binding-level errors."""
    replace = replace or {}
    registry = Actions()
    for kind, names in (
        ("guard", ["at_limit"]),
        ("effect", ["start_count", "increment", "report", "clear"]),
        (
            "predicate",
            [
                "count_within_limit",
                "report_only_on_reaching_limit",
                "limit_reached",
                "count_abandoned",
            ],
        ),
    ):
        for name in names:
            getattr(registry, kind)(replace.get(name, getattr(toy, name)))
    for guard in extra_guards:
        registry.guard(guard)
    return registry


def test_registered_function_no_row_uses_is_refused() -> None:
    def idle_for_long(context: object, event: object) -> bool:
        return False

    table = load_table(TOY_TABLE_PATH)
    message = str(
        pytest.raises(
            SpecError, build_machine, table, _toy_actions(extra_guards=(idle_for_long,))
        ).value
    )
    assert "'idle_for_long'" in message and "no row or invariant names it" in message
    assert str(TOY_TABLE_PATH) in message


def test_guard_with_wrong_arity_is_refused() -> None:
    def at_limit(context: object) -> bool:
        return False

    table = load_table(TOY_TABLE_PATH)
    message = str(
        pytest.raises(
            SpecError, build_machine, table, _toy_actions(replace={"at_limit": at_limit})
        ).value
    )
    assert "guard 'at_limit' takes 1 positional argument(s), a guard takes 2" in message


def test_step_predicate_with_state_arity_is_refused() -> None:
    def count_abandoned(state: object) -> bool:
        return False

    table = load_table(TOY_TABLE_PATH)
    actions = _toy_actions(replace={"count_abandoned": count_abandoned})
    message = str(pytest.raises(SpecError, build_machine, table, actions).value)
    assert "TOY-4" in message and "'count_abandoned' takes 1" in message


def test_one_name_registered_as_two_kinds_is_refused() -> None:
    registry = Actions()
    registry.guard(toy.at_limit)
    with pytest.raises(SpecError, match="'at_limit' is already registered as a guard"):
        registry.effect(toy.at_limit)


def test_machine_package_imports_without_torch_or_mpi4py() -> None:
    # docs/design.md §1: scout.core is pure; a None entry in sys.modules makes any import of it fail.
    code = (
        "import sys\n"
        "sys.modules['torch'] = None\nsys.modules['mpi4py'] = None\n"
        "import scout.core.machine, scout.commands.spec\n"
        "assert 'torch' not in [m for m, v in sys.modules.items() if v is not None]\n"
    )
    processes.run([sys.executable, "-c", code], check=True, timeout=120)
