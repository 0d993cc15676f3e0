"""Read a spec TOML file and bind it to its Python: the only I/O in ``scout.core``.

``load_table`` reads and validates the table alone (enough to render documents);
``load_machine`` also imports the bindings module the table names and builds the machine.
"""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path
from typing import Any

from scout.core.machine.bindings import Bindings
from scout.core.machine.errors import SpecError
from scout.core.machine.parse import parse_table
from scout.core.machine.runtime import Machine, build_machine
from scout.core.machine.table import MachineTable

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

BINDINGS_ATTRIBUTE = "BINDINGS"


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


def load_bindings(table: MachineTable) -> Bindings:
    try:
        module = importlib.import_module(table.bindings)
    except ImportError as error:
        raise SpecError(
            f"{table.source}: [machine] bindings = {table.bindings!r} cannot be imported ({error}); "
            "name an importable module"
        ) from error
    except SpecError as error:
        raise SpecError(
            f"{table.source}: importing bindings {table.bindings!r} failed: {error}"
        ) from error
    bindings = getattr(module, BINDINGS_ATTRIBUTE, None)
    if not isinstance(bindings, Bindings):
        raise SpecError(
            f"{table.source}: bindings module {table.bindings!r} has no {BINDINGS_ATTRIBUTE} = Bindings() "
            f"(found {bindings!r}); create one and register the guards, effects and predicates on it"
        )
    return bindings


def load_machine(path: str | os.PathLike[str]) -> Machine[Any]:
    """Load, validate and build the machine a spec file describes. Raises :class:`SpecError`."""
    table = load_table(path)
    return build_machine(table, load_bindings(table))
