"""Read a spec TOML file and bind it to its Python: the only I/O in ``scout.core``.

``load_table`` reads and validates the table alone (enough to render documents);
``load_machine`` also imports the actions module the table names and builds the machine.
``packaged_machine`` loads the copy of a table that ships inside the package
(``scout/core/tables/<name>.toml``, written from ``spec/<name>.toml`` by ``scout spec`` and
proved identical by ``scout spec --check``), so an installed wheel runs the same machine as a
checkout.
"""

from __future__ import annotations

import functools
import importlib
import importlib.resources
import os
import sys
from pathlib import Path
from typing import Any

from scout.core.machine.actions import Actions
from scout.core.machine.errors import SpecError
from scout.core.machine.parse import parse_table
from scout.core.machine.runtime import Machine, build_machine
from scout.core.machine.table import MachineTable

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

ACTIONS_ATTRIBUTE = "ACTIONS"


def read_toml(path: str | os.PathLike[str]) -> dict[str, Any]:
    spec_path = Path(path)
    try:
        with spec_path.open("rb") as file:
            data: dict[str, Any] = tomllib.load(file)
    except OSError as error:
        raise SpecError(f"{spec_path}: cannot read the spec file: {error}") from error
    except tomllib.TOMLDecodeError as error:
        raise SpecError(f"{spec_path}: not valid TOML: {error}") from error
    return data


def load_table(path: str | os.PathLike[str]) -> MachineTable:
    """Read and validate a machine table; its ``[machine] name`` must be the file's stem, so
    ``spec/observer.toml`` always documents into ``spec/observer.md``."""
    spec_path = Path(path)
    table = parse_table(read_toml(spec_path), str(spec_path))
    if table.name != spec_path.stem:
        raise SpecError(
            f"{spec_path}: [machine] name = {table.name!r} differs from the file name; "
            f"rename the file to {table.name}.toml or set name = {spec_path.stem!r}"
        )
    return table


def load_actions(table: MachineTable) -> Actions:
    try:
        module = importlib.import_module(table.actions)
    except ImportError as error:
        raise SpecError(
            f"{table.source}: [machine] actions = {table.actions!r} cannot be imported ({error}); "
            "name an importable module"
        ) from error
    except SpecError as error:
        raise SpecError(
            f"{table.source}: importing actions {table.actions!r} failed: {error}"
        ) from error
    actions = getattr(module, ACTIONS_ATTRIBUTE, None)
    if not isinstance(actions, Actions):
        raise SpecError(
            f"{table.source}: actions module {table.actions!r} has no {ACTIONS_ATTRIBUTE} = Actions() "
            f"(found {actions!r}); create one and register the guards, effects and predicates on it"
        )
    return actions


def load_machine(path: str | os.PathLike[str]) -> Machine[Any]:
    """Load, validate and build the machine a spec file describes. Raises :class:`SpecError`."""
    table = load_table(path)
    return build_machine(table, load_actions(table))


#: The machines whose tables ship inside the package.
PACKAGED_TABLES = ("gate", "observer", "straggler")
TABLES_PACKAGE = "scout.core.tables"


def packaged_table_text(name: str) -> str:
    """The text of the packaged copy of ``spec/<name>.toml``. Raises SpecError naming the
    table when it is not packaged."""
    if name not in PACKAGED_TABLES:
        raise SpecError(f"no packaged machine table {name!r}; the packaged tables are {list(PACKAGED_TABLES)}")
    resource = importlib.resources.files(TABLES_PACKAGE).joinpath(f"{name}.toml")
    try:
        return resource.read_text(encoding="utf-8")
    except OSError as error:
        raise SpecError(
            f"the packaged machine table {TABLES_PACKAGE}/{name}.toml cannot be read ({error}); "
            "reinstall scout (the wheel ships it as package data)"
        ) from error


@functools.cache
def packaged_machine(name: str) -> Machine[Any]:
    """The machine of the packaged table ``name`` (built once per process)."""
    source = f"scout/core/tables/{name}.toml"
    try:
        data: dict[str, Any] = tomllib.loads(packaged_table_text(name))
    except tomllib.TOMLDecodeError as error:
        raise SpecError(f"{source}: not valid TOML: {error}") from error
    table = parse_table(data, source)
    return build_machine(table, load_actions(table))
