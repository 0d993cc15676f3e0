"""MoE expert recipes, pure part (spec/moe.md MOE-*): row materialization, execution
fingerprints, the regime catalog and its compression, heterogeneous-routing templates, the
all-to-all replay traffic matrix. No torch, no I/O: the torch side (``scout.replay.moe``,
``scout.replay.moe_catalog``) records and replays, this module decides.

Vocabulary. An MoE layer's grouped experts run one *expert GEMM* per local expert on that
expert's *packed input* (the rows the router sent it). An *expert slot* is one local expert of
one MoE layer on this rank (layer major). An expert recipe replays one slot at a chosen row count
``n_exec`` (MOE-2). Which ``n_exec`` values need their own replay is a property of the kernels
that run (MOE-4): ``n_exec`` values whose executions leave equal fingerprints form a *regime*,
and within a regime a larger execution *covers* a smaller one (MOE-5).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

import attrs

from scout.core.guards import whole_number

__all__ = [
    "CATALOG_SCHEMA",
    "CatalogEnvironmentError",
    "ExecRecord",
    "Fingerprint",
    "LayerCatalog",
    "Regime",
    "RegimeCatalog",
    "Template",
    "balanced_traffic",
    "build_layer_catalog",
    "covers",
    "expert_rows",
    "materialize_rows",
    "qualify_template",
    "validate_counts",
]

CATALOG_SCHEMA: Final = "scout.moe-catalog/1"
#: The symbol that replaces a dimension equal to ``n_exec`` in a normalized fingerprint (MOE-4).
ROWS_SYMBOL: Final = "N"


# --------------------------------------------------------------------------------------------
# Counts and materialization (MOE-2, MOE-3)
# --------------------------------------------------------------------------------------------


def validate_counts(counts: Sequence[int], total_rows: int, experts: int) -> tuple[int, ...]:
    """MOE-3: per-expert token counts of one grouped call: ``experts`` non-negative ints that
    sum to the packed input's ``total_rows``. Anything else is an error naming the values."""
    values = tuple(counts)
    if len(values) != experts:
        raise ValueError(f"{len(values)} per-expert counts for {experts} local experts: {list(values)}")
    bad = [c for c in values if not whole_number(c) or c < 0]
    if bad:
        raise ValueError(f"per-expert counts must be ints >= 0, got {list(values)}")
    if sum(values) != total_rows:
        raise ValueError(
            f"per-expert counts {list(values)} sum to {sum(values)}, but the packed input has "
            f"{total_rows} rows"
        )
    return values


def expert_rows(counts: Sequence[int], expert: int) -> tuple[int, int]:
    """MOE-2: the rows ``[start, stop)`` of the packed input that belong to ``expert``; an
    expert that received no token borrows the whole packed input (its weights are still
    exercised, on rows every replica receives from the source)."""
    if not 0 <= expert < len(counts):
        raise ValueError(f"expert {expert} outside 0..{len(counts) - 1}")
    start = sum(counts[:expert])
    stop = start + counts[expert]
    if stop == start:
        return 0, sum(counts)
    return start, stop


def materialize_rows(available: int, n_exec: int) -> tuple[int, ...]:
    """MOE-2: the ``n_exec`` source-row indices a replay uses out of ``available`` rows:
    the first ``n_exec`` (deterministic truncation) when there are enough, otherwise the rows
    repeated cyclically (``i mod available``). No randomness: every replica computes the same."""
    if not whole_number(n_exec) or n_exec < 1:
        raise ValueError(f"n_exec must be an int >= 1, got {n_exec!r}")
    if not whole_number(available) or available < 1:
        raise ValueError(f"an expert replay needs at least one source row, got {available!r}")
    return tuple(i % available for i in range(n_exec))


# --------------------------------------------------------------------------------------------
# Execution fingerprints (MOE-4)
# --------------------------------------------------------------------------------------------

Dim = int | str


@attrs.frozen(order=True)
class ExecRecord:
    """One thing the backend reported running: on CUDA a kernel launch (``op`` its name,
    ``grid`` and ``block``), on CPU a dispatched operator (``op``, ``shapes``, ``strides``,
    ``dtype``, ``tag`` -- e.g. the BLAS/oneDNN path the build reports)."""

    op: str
    shapes: tuple[tuple[Dim, ...], ...] = ()
    strides: tuple[tuple[Dim, ...], ...] = ()
    dtype: str = ""
    tag: str = ""
    grid: tuple[int, ...] = ()
    block: tuple[int, ...] = ()

    def has_zero_size(self) -> bool:
        return any(0 in shape for shape in self.shapes)

    def normalized(self, n_exec: int) -> ExecRecord:
        """Dimensions equal to ``n_exec`` become the symbol ``N``; the grid is dropped (it
        scales with the rows and enters the preorder instead, MOE-5). A weight dimension
        that happens to equal ``n_exec`` is symbolized too: that value then forms its own
        regime -- more replays, never fewer."""

        def symbolic(values: tuple[Dim, ...]) -> tuple[Dim, ...]:
            return tuple(ROWS_SYMBOL if v == n_exec else v for v in values)

        return attrs.evolve(
            self,
            shapes=tuple(symbolic(s) for s in self.shapes),
            strides=tuple(symbolic(s) for s in self.strides),
            grid=(),
        )


@attrs.frozen
class Fingerprint:
    """What one expert GEMM at one ``n_exec`` ran, in order. ``complete`` False (with the
    reason) when the backend did not report enough to compare executions (MOE-4): then the
    ``n_exec`` keeps its own exact key."""

    n_exec: int
    records: tuple[ExecRecord, ...]
    complete: bool = True
    reason: str = ""

    def key(self) -> tuple[ExecRecord, ...]:
        """The regime key: the normalized records (MOE-4)."""
        return tuple(r.normalized(self.n_exec) for r in self.records)


def covers(a: Fingerprint, b: Fingerprint) -> bool:
    """MOE-5, the coverage preorder: ``a`` covers ``b`` iff both are complete, have the same
    regime key, ``a.n_exec >= b.n_exec``, and every launch of ``a`` has a grid at least as large,
    dimension by dimension, as the corresponding launch of ``b`` (it runs every tile and block
    index ``b`` runs, on the same kernels). Reflexive and transitive."""
    if not (a.complete and b.complete) or a.key() != b.key() or a.n_exec < b.n_exec:
        return False
    for record_a, record_b in zip(a.records, b.records, strict=True):
        if len(record_a.grid) != len(record_b.grid):
            return False
        if any(x < y for x, y in zip(record_a.grid, record_b.grid, strict=True)):
            return False
    return True


@attrs.frozen
class Regime:
    """``n_exec`` values with equal fingerprints; ``representatives`` are the Pareto-maximal
    members under :func:`covers` -- the values replayed. ``exact`` marks the one-member regime
    of an incomplete fingerprint (MOE-4)."""

    members: tuple[int, ...]
    representatives: tuple[int, ...]
    fingerprint: str  # a stable text digest of the key, for people and the JSON
    exact: bool = False
    reason: str = ""

    def covering(self, n_exec: int) -> int | None:
        return n_exec if n_exec in self.representatives else None


def _describe_key(records: Iterable[ExecRecord]) -> str:
    parts = []
    for r in records:
        text = r.op
        if r.shapes:
            text += "[" + ";".join("x".join(map(str, s)) for s in r.shapes) + "]"
        if r.dtype:
            text += ":" + r.dtype
        if r.tag:
            text += "/" + r.tag
        if r.block:
            text += "<" + "x".join(map(str, r.block)) + ">"
        parts.append(text)
    return " ".join(parts) or "(none)"


@attrs.frozen
class LayerCatalog:
    """The regimes of one MoE layer's expert GEMM (all its slots share shapes and kernels):
    ``slots`` are this layer's expert slots, ``n_exec`` every value profiled."""

    layer: int
    slots: tuple[int, ...]
    n_exec: tuple[int, ...]
    regimes: tuple[Regime, ...]
    # The covering representative of each profiled n_exec (MOE-5), kept for the assertion.
    cover: tuple[tuple[int, int], ...]

    def representatives(self) -> tuple[int, ...]:
        return tuple(sorted({n for regime in self.regimes for n in regime.representatives}))

    def covering(self, n_exec: int) -> int:
        for n, representative in self.cover:
            if n == n_exec:
                return representative
        raise KeyError(f"n_exec {n_exec} was not profiled for MoE layer {self.layer} (profiled: {list(self.n_exec)})")


def build_layer_catalog(layer: int, slots: Sequence[int], fingerprints: Sequence[Fingerprint]) -> LayerCatalog:
    """MOE-4, MOE-5: group the profiled ``n_exec`` values of one layer by fingerprint and keep
    each regime's Pareto-maximal members; an incomplete fingerprint is its own exact regime."""
    if not fingerprints:
        raise ValueError(f"MoE layer {layer}: no n_exec was profiled; give at least one")
    values = [f.n_exec for f in fingerprints]
    if len(set(values)) != len(values):
        raise ValueError(f"MoE layer {layer}: n_exec values repeat: {values}")
    groups: dict[tuple[ExecRecord, ...], list[Fingerprint]] = {}
    regimes: list[Regime] = []
    cover: dict[int, int] = {}
    for fingerprint in sorted(fingerprints, key=lambda f: f.n_exec):
        if not fingerprint.complete:
            regimes.append(Regime((fingerprint.n_exec,), (fingerprint.n_exec,),
                                  _describe_key(fingerprint.records), exact=True, reason=fingerprint.reason))
            cover[fingerprint.n_exec] = fingerprint.n_exec
            continue
        groups.setdefault(fingerprint.key(), []).append(fingerprint)
    for key, members in groups.items():
        # Pareto-maximal: no other member strictly above it. In a finite preorder every member
        # lies below some maximal one; it is replayed through the smallest such.
        maximal = [m for m in members if not any(covers(o, m) and not covers(m, o) for o in members)]
        for member in members:
            cover[member.n_exec] = min(r.n_exec for r in maximal if covers(r, member))
        representatives = sorted({cover[m.n_exec] for m in members})
        regimes.append(Regime(tuple(m.n_exec for m in members), tuple(representatives), _describe_key(key)))
    regimes.sort(key=lambda r: r.members[0])
    return LayerCatalog(layer, tuple(slots), tuple(sorted(values)), tuple(regimes), tuple(sorted(cover.items())))


# --------------------------------------------------------------------------------------------
# Heterogeneous routing templates (MOE-6)
# --------------------------------------------------------------------------------------------


@attrs.frozen
class Template:
    """A heterogeneous per-expert count vector of one layer and whether the catalog covers it."""

    layer: int
    counts: tuple[int, ...]
    qualified: bool
    reason: str


def qualify_template(
    layer: LayerCatalog,
    counts: Sequence[int],
    template_records: Sequence[ExecRecord],
    per_expert_records: Mapping[int, Sequence[ExecRecord]],
) -> Template:
    """MOE-6: a heterogeneous call with ``counts`` is covered by per-expert replays exactly when
    (1) what it ran, less the operations on empty tensors, is -- as a multiset: backward runs
    the experts in reverse -- what the experts with a non-zero count run alone at their own
    counts, and (2) each such
    count was profiled, so a replayed representative covers it. A fused grouped kernel whose one
    launch depends on the whole count vector fails (1) and is not qualified."""
    values = tuple(counts)
    missing = sorted({c for c in values if c > 0 and c not in layer.n_exec})
    if missing:
        return Template(layer.layer, values, False, f"counts {missing} were not profiled")
    expected: list[ExecRecord] = []
    for expert, count in enumerate(values):
        if count > 0:
            if expert not in per_expert_records:
                return Template(layer.layer, values, False, f"expert {expert} at {count} rows was not profiled alone")
            expected += [r for r in per_expert_records[expert] if not r.has_zero_size()]
    ran = [r for r in template_records if not r.has_zero_size()]
    if not ran:
        return Template(layer.layer, values, False, "the backend reported nothing for the heterogeneous call")
    if sorted(ran, key=repr) != sorted(expected, key=repr):
        return Template(layer.layer, values, False,
                        f"the call ran {len(ran)} record(s) that do not decompose into the experts' own "
                        f"{len(expected)}: its kernels depend on the whole count vector")
    return Template(layer.layer, values, True, "decomposes into covered per-expert executions")


# --------------------------------------------------------------------------------------------
# The catalog, versioned and bound to its environment (MOE-7)
# --------------------------------------------------------------------------------------------


#: MOE-7: what a catalog is bound to.
REQUIRED_ENVIRONMENT: Final = ("torch", "device", "dtype", "model")


class CatalogEnvironmentError(ValueError):
    """A regime catalog was built for another environment (MOE-7)."""


@attrs.frozen
class RegimeCatalog:
    """Every MoE layer's regimes, the qualified templates, and the environment they hold in:
    ``environment`` maps ``torch``, ``device``, ``dtype`` and ``model`` to strings."""

    environment: tuple[tuple[str, str], ...]
    layers: tuple[LayerCatalog, ...]
    templates: tuple[Template, ...] = ()

    def __attrs_post_init__(self) -> None:
        keys = dict(self.environment)
        missing = [k for k in REQUIRED_ENVIRONMENT if not keys.get(k)]
        if missing:
            raise ValueError(f"a regime catalog is bound to its environment; missing {missing}")
        slots = [s for layer in self.layers for s in layer.slots]
        if len(set(slots)) != len(slots):
            raise ValueError(f"expert slots repeat across MoE layers: {slots}")

    def expert_keys(self) -> tuple[tuple[int, int], ...]:
        """MOE-5: the compressed recipes: every slot at every representative of its layer."""
        return tuple((slot, n) for layer in self.layers for slot in layer.slots for n in layer.representatives())

    def exact_keys(self) -> tuple[tuple[int, int], ...]:
        """Every slot at every profiled ``n_exec``: what replaying without the catalog costs."""
        return tuple((slot, n) for layer in self.layers for slot in layer.slots for n in layer.n_exec)

    def layer_of(self, slot: int) -> LayerCatalog:
        for layer in self.layers:
            if slot in layer.slots:
                return layer
        raise KeyError(f"expert slot {slot} is in no MoE layer of this catalog")

    def assert_covers(self, keys: Iterable[tuple[int, int]]) -> None:
        """MOE-5's coverage assertion: every ``(slot, n_exec)`` is covered by a replayed key of
        the same slot in the same regime. Raises ValueError naming the first key that is not."""
        replayed = set(self.expert_keys())
        for slot, n_exec in keys:
            layer = self.layer_of(slot)
            representative = layer.covering(n_exec)
            regime = next(r for r in layer.regimes if n_exec in r.members)
            if representative not in regime.representatives or (slot, representative) not in replayed:
                raise ValueError(f"expert slot {slot} at n_exec {n_exec} is not covered by a replayed regime")

    def check_environment(self, environment: Mapping[str, str]) -> None:
        """MOE-7: loading a catalog elsewhere is an error naming every difference."""
        mine = dict(self.environment)
        different = {k: (mine.get(k), environment.get(k)) for k in REQUIRED_ENVIRONMENT
                     if mine.get(k) != environment.get(k)}
        if different:
            details = ", ".join(f"{k}: catalog {a!r}, here {b!r}" for k, (a, b) in sorted(different.items()))
            raise CatalogEnvironmentError(
                f"this MoE regime catalog was built for another environment ({details}); rebuild it here "
                "with `scout moe-catalog`")

    def qualified_templates(self) -> tuple[str, ...]:
        return tuple(f"layer{t.layer}:{list(t.counts)}" for t in self.templates if t.qualified)

    # -- JSON ----------------------------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": CATALOG_SCHEMA,
            "environment": dict(self.environment),
            "layers": [
                {
                    "layer": layer.layer,
                    "slots": list(layer.slots),
                    "n_exec": list(layer.n_exec),
                    "cover": [[n, r] for n, r in layer.cover],
                    "regimes": [
                        {"members": list(r.members), "representatives": list(r.representatives),
                         "fingerprint": r.fingerprint, "exact": r.exact, "reason": r.reason}
                        for r in layer.regimes
                    ],
                }
                for layer in self.layers
            ],
            "templates": [
                {"layer": t.layer, "counts": list(t.counts), "qualified": t.qualified, "reason": t.reason}
                for t in self.templates
            ],
            "summary": {"exact_keys": len(self.exact_keys()), "compressed_keys": len(self.expert_keys())},
        }

    @classmethod
    def from_json(cls, data: Any, environment: Mapping[str, str] | None = None) -> RegimeCatalog:
        """Decode (MOE-7); with ``environment``, refuse a catalog built for another one."""
        if not isinstance(data, dict) or data.get("schema") != CATALOG_SCHEMA:
            found = data.get("schema") if isinstance(data, dict) else type(data).__name__
            raise ValueError(f"not a {CATALOG_SCHEMA} catalog (schema {found!r}); rebuild it with `scout moe-catalog`")
        try:
            layers = tuple(
                LayerCatalog(
                    int(layer["layer"]), tuple(int(s) for s in layer["slots"]), tuple(int(n) for n in layer["n_exec"]),
                    tuple(Regime(tuple(int(m) for m in r["members"]), tuple(int(m) for m in r["representatives"]),
                                 str(r["fingerprint"]), bool(r["exact"]), str(r["reason"])) for r in layer["regimes"]),
                    tuple((int(n), int(r)) for n, r in layer["cover"]),
                )
                for layer in data["layers"]
            )
            templates = tuple(Template(int(t["layer"]), tuple(int(c) for c in t["counts"]), bool(t["qualified"]),
                                       str(t["reason"])) for t in data.get("templates", []))
            catalog = cls(tuple(sorted((str(k), str(v)) for k, v in data["environment"].items())), layers, templates)
        except (KeyError, TypeError, ValueError) as error:
            raise ValueError(f"malformed {CATALOG_SCHEMA} catalog: {error!r}") from error
        if environment is not None:
            catalog.check_environment(environment)
        return catalog


# --------------------------------------------------------------------------------------------
# All-to-all dispatch/combine replay (MOE-8)
# --------------------------------------------------------------------------------------------


def balanced_traffic(ep_size: int, rows_per_pair: int) -> tuple[tuple[int, ...], ...]:
    """MOE-8: the fixed traffic matrix an all-to-all replay sends: every EP rank sends
    ``rows_per_pair`` rows to every EP rank (itself included). Balanced, so every rank sends and
    receives the same bytes, and independent of routing, so every replica's replay is alike."""
    if ep_size < 1 or rows_per_pair < 1:
        raise ValueError(f"an all-to-all replay needs ep_size >= 1 and rows_per_pair >= 1, got {ep_size}, {rows_per_pair}")
    return tuple(tuple(rows_per_pair for _ in range(ep_size)) for _ in range(ep_size))
