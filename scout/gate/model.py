"""Values of the two-cycle checkpoint gate: configuration, events, effects, trust and records.

The machine itself is ``spec/gate.toml`` (normative) bound to :mod:`scout.gate.machine`;
:mod:`scout.gate.step` validates input and steps it. Everything here is a frozen, hashable attrs
value, so the explorer can deduplicate gate states and the manifest codec can round-trip them.
Vocabulary (spec/gate.md):

- a *recipe* is one replay the catalog schedules (embedding, a hidden layer, the head, an
  optimizer slice); a *peer group* is a set of replicas whose replays must agree;
- a *recipe result* carries one verdict per peer group the recipe applies to;
- a *cycle* runs from one boundary to the next and is *complete* when every recipe has an
  accepted result in it, *clean* when every verdict in it was AGREE.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from typing import Any, ClassVar, Final

import attrs

from scout.core.failure import FailureClass
from scout.core.guards import whole_number

__all__ = [
    "ABSORBING",
    "Artifact",
    "Certificate",
    "CheckpointCaptured",
    "CheckpointEntry",
    "CheckpointId",
    "CheckpointLost",
    "CycleBoundary",
    "CycleRecord",
    "GateConfig",
    "GateContext",
    "GateEffect",
    "GateEvent",
    "GateReport",
    "GateReportKind",
    "GateState",
    "GroupVerdict",
    "Outcome",
    "Persist",
    "Recipe",
    "RecipeVerdicts",
    "Replay",
    "Restart",
    "ResultClass",
    "STEP_MAX",
    "SdcRecord",
    "Trust",
    "TrustChange",
    "is_complete_and_clean",
    "is_counter",
]


class GateState(str, enum.Enum):
    """Control states of spec/gate.toml (the loader checks both name the same states)."""

    IDLE = "IDLE"
    CHECKING = "CHECKING"
    UNCLEAN = "UNCLEAN"
    TAINTED = "TAINTED"


class Outcome(enum.Enum):
    """One peer group's verdict on one replay, as the gate sees it."""

    AGREE = "AGREE"
    ATTRIBUTED = "ATTRIBUTED"  # an exact-mode outlier: silent data corruption (SDC)
    INCONCLUSIVE = "INCONCLUSIVE"  # the group could not decide: unchecked, not SDC
    MISSING = "MISSING"  # the group's verdict did not arrive: unchecked, not SDC


class ResultClass(enum.Enum):
    """What a whole recipe result means for the gate (GATE-4, GATE-5)."""

    CLEAN = "clean"  # every applicable group agreed
    UNCHECKED = "unchecked"  # some group was Inconclusive or missing, none Attributed
    SDC = "sdc"  # some group attributed an outlier


class Trust(enum.Enum):
    """Per-checkpoint trust states (spec/gate.md, "Trust")."""

    CAPTURED = "CAPTURED"  # restorable as "latest"; not awaiting verification
    CANDIDATE = "CANDIDATE"  # captured at the end of a complete clean cycle; awaits the next
    RECOVERY_VERIFIED = "RECOVERY_VERIFIED"  # bracketed by two complete clean cycles; certified
    QUARANTINED = "QUARANTINED"  # an SDC was seen while it was unverified; never restored
    SUPERSEDED = "SUPERSEDED"  # abandoned by a restart to an earlier step; never restored
    LOST = "LOST"  # its files are gone from where it was saved (GATE-42); never restored


#: Trust states from which a checkpoint may be restored.
RESTORABLE: Final = frozenset({Trust.CAPTURED, Trust.CANDIDATE, Trust.RECOVERY_VERIFIED})
#: Trust states an SDC takes away (GATE-4).
UNVERIFIED_RESTORABLE: Final = frozenset({Trust.CAPTURED, Trust.CANDIDATE})
#: Trust no step leaves (GATE-2): never restored, whatever happens later.
ABSORBING: Final = frozenset({Trust.QUARANTINED, Trust.SUPERSEDED, Trust.LOST})


class GateReportKind(enum.Enum):
    SDC = "sdc"
    UNCHECKED = "unchecked"


def _nonempty_name(instance: object, attribute: attrs.Attribute[str], value: str) -> None:
    if not isinstance(value, str) or not value or value != value.strip():
        raise ValueError(f"{attribute.name} must be a non-empty string without outer spaces, got {value!r}")


#: The largest step (and cycle and timeline number) the gate accepts (GATE-35). Checkpoint
#: directories carry the step in 12 digits (scout.gate.dcp); a step beyond that is a unit or
#: overflow mistake, and accepting it would wedge the gate, since every later event would be
#: "behind" it.
STEP_MAX: Final = 10**12 - 1


def is_counter(value: object) -> bool:
    """An int in 0..STEP_MAX: a step, a cycle or a timeline number the gate accepts (GATE-35)."""
    return whole_number(value) and 0 <= value <= STEP_MAX


def _step_value(instance: object, attribute: attrs.Attribute[int], value: int) -> None:
    if not is_counter(value):
        raise ValueError(f"{attribute.name} must be an int in 0..{STEP_MAX} (a training step), got {value!r}")


@attrs.frozen(order=True, cache_hash=True)
class CheckpointId:
    """A checkpoint is named by its timeline (restarts so far) and its training step: after a
    restart the job re-runs steps, so a step alone does not name one checkpoint."""

    timeline: int = attrs.field(validator=_step_value)
    step: int = attrs.field(validator=_step_value)

    def __str__(self) -> str:
        return f"t{self.timeline}/s{self.step}"


@attrs.frozen(cache_hash=True)
class Recipe:
    """One catalog entry. ``groups`` names the peer groups it applies to (None: every group).
    A recipe that does not apply to a group is configuration, never "missing" evidence
    (docs/prior-art.md lesson 4, reference weakness R8)."""

    id: str = attrs.field(validator=_nonempty_name)
    groups: tuple[str, ...] | None = None


def _names(value: Iterable[str]) -> tuple[str, ...]:
    return tuple(value)


def _recipes(value: Iterable[Recipe | str]) -> tuple[Recipe, ...]:
    return tuple(item if isinstance(item, Recipe) else Recipe(item) for item in value)


@attrs.frozen(cache_hash=True)
class GateConfig:
    """The job's recipe catalog and peer groups; fixed for the job's lifetime."""

    job_id: str = attrs.field(validator=_nonempty_name)
    recipes: tuple[Recipe, ...] = attrs.field(converter=_recipes)
    groups: tuple[str, ...] = attrs.field(converter=_names)
    #: What the catalog's coverage rests on beyond its recipes, stated in every certificate
    #: (spec/moe.md MOE-6: the heterogeneous routing templates an MoE catalog qualified).
    coverage_notes: tuple[str, ...] = attrs.field(default=(), converter=_names)

    def __attrs_post_init__(self) -> None:
        if not self.recipes:
            raise ValueError("the recipe catalog is empty: a cycle needs at least one recipe")
        if not self.groups:
            raise ValueError("no peer groups: every recipe needs at least one group to vote")
        for group in self.groups:
            if not isinstance(group, str) or not group:
                raise ValueError(f"peer group names must be non-empty strings, got {group!r}")
        if len(set(self.groups)) != len(self.groups):
            raise ValueError(f"peer group names repeat: {list(self.groups)}")
        ids = [recipe.id for recipe in self.recipes]
        if len(set(ids)) != len(ids):
            raise ValueError(f"recipe ids repeat in the catalog: {ids}")
        for recipe in self.recipes:
            if recipe.groups is None:
                continue
            unknown = [g for g in recipe.groups if g not in self.groups]
            if unknown or not recipe.groups or len(set(recipe.groups)) != len(recipe.groups):
                raise ValueError(
                    f"recipe {recipe.id!r} applies to groups {list(recipe.groups)}: they must be a "
                    f"non-empty list without repeats of the job's groups {list(self.groups)}"
                )

    @property
    def recipe_ids(self) -> tuple[str, ...]:
        return tuple(recipe.id for recipe in self.recipes)

    def groups_of(self, recipe_id: str) -> tuple[str, ...]:
        """The groups a recipe applies to, in the job's group order."""
        for recipe in self.recipes:
            if recipe.id == recipe_id:
                if recipe.groups is None:
                    return self.groups
                return tuple(g for g in self.groups if g in recipe.groups)
        raise KeyError(recipe_id)


@attrs.frozen(cache_hash=True)
class GroupVerdict:
    """One peer group's verdict on one replay. ``outliers`` are peer positions in the group
    (ATTRIBUTED only); ``reason`` is the Inconclusive reason code (VERDICT-5) or ``no-result``.
    Types are checked here, at the boundary (GATE-35): an outcome given as the string
    ``"ATTRIBUTED"`` would otherwise read as "not SDC"."""

    group: str
    outcome: Outcome
    outliers: tuple[int, ...] = ()
    reason: str = ""
    #: AGREE only: every peer's live output of the replayed call was reproduced by its own replay
    #: (spec/replay.md SELF-4, SELF-7); certificates say which replays covered the live path.
    self_checked: bool = False

    def __attrs_post_init__(self) -> None:
        if not isinstance(self.group, str) or not self.group:
            raise TypeError(f"GroupVerdict.group must be a non-empty str (a peer group name), got {self.group!r}")
        if not isinstance(self.outcome, Outcome):
            raise TypeError(
                f"group {self.group!r}: outcome must be a scout.gate.model.Outcome member "
                f"({', '.join(f'Outcome.{o.name}' for o in Outcome)}), got {type(self.outcome).__name__} "
                f"{self.outcome!r}"
            )
        if not isinstance(self.outliers, tuple) or not all(
            whole_number(p) and p >= 0 for p in self.outliers
        ):
            raise TypeError(f"group {self.group!r}: outliers must be a tuple of peer positions (ints >= 0), "
                            f"got {self.outliers!r}")
        if list(self.outliers) != sorted(set(self.outliers)):
            raise ValueError(f"group {self.group!r}: outliers {list(self.outliers)} must be ascending without repeats "
                             "(VERDICT-2)")
        if not isinstance(self.reason, str):
            raise TypeError(f"group {self.group!r}: reason must be a str, got {self.reason!r}")
        if not isinstance(self.self_checked, bool) or (self.self_checked and self.outcome is not Outcome.AGREE):
            raise ValueError(f"group {self.group!r}: self_checked must be a bool, true only with AGREE; got "
                             f"{self.self_checked!r} with {self.outcome.value}")
        if (self.outcome is Outcome.ATTRIBUTED) != bool(self.outliers):
            raise ValueError(
                f"group {self.group!r}: outliers {list(self.outliers)} with outcome "
                f"{self.outcome.value}; exactly an ATTRIBUTED verdict names outliers"
            )


# ------------------------------------------------------------------------------------------
# Events (spec/gate.toml [events])
# ------------------------------------------------------------------------------------------


def _verdicts(value: Iterable[GroupVerdict]) -> tuple[GroupVerdict, ...]:
    if isinstance(value, (str, bytes, GroupVerdict)) or not isinstance(value, Iterable):
        raise TypeError(f"verdicts must be a sequence of GroupVerdict, one per applicable group, got "
                        f"{type(value).__name__} {value!r}")
    return tuple(value)


@attrs.frozen(cache_hash=True)
class RecipeVerdicts:
    """The job-wide result of one replay: one verdict per peer group the recipe applies to."""

    trigger: ClassVar[str] = "result"
    recipe: str
    cycle: int
    step: int
    verdicts: tuple[GroupVerdict, ...] = attrs.field(converter=_verdicts)
    # Derived once: guards, predicates and the explorer ask for it on every step.
    result_class: ResultClass = attrs.field(init=False, eq=False, repr=False)

    def __attrs_post_init__(self) -> None:
        if not isinstance(self.recipe, str) or not self.recipe:
            raise TypeError(f"RecipeVerdicts.recipe must be a non-empty str (a recipe id), got {self.recipe!r}")
        for name in ("cycle", "step"):
            if not is_counter(getattr(self, name)):
                raise ValueError(f"result for recipe {self.recipe!r}: {name} must be an int in 0..{STEP_MAX}, "
                                 f"got {getattr(self, name)!r}")
        for verdict in self.verdicts:
            if not isinstance(verdict, GroupVerdict):
                raise TypeError(f"result for recipe {self.recipe!r}: verdicts must be GroupVerdict values, got "
                                f"{type(verdict).__name__} {verdict!r}")
        outcomes = [verdict.outcome for verdict in self.verdicts]
        if Outcome.ATTRIBUTED in outcomes:
            result_class = ResultClass.SDC
        elif all(outcome is Outcome.AGREE for outcome in outcomes):
            result_class = ResultClass.CLEAN
        else:
            result_class = ResultClass.UNCHECKED
        object.__setattr__(self, "result_class", result_class)


def _artifact_text(instance: object, attribute: attrs.Attribute[str], value: str) -> None:
    if not isinstance(value, str) or not value:
        raise TypeError(f"Artifact.{attribute.name} must be a non-empty str, got {value!r} (GATE-35)")


@attrs.frozen(cache_hash=True)
class Artifact:
    """Where a checkpoint the framework wrote lives, and what it held (spec/frameworks.md FRAME-6,
    FRAME-7): its ``format`` (``huggingface``, ``lightning``, ...), its ``path`` (a directory or a
    file) and the content digest of its files. The gate only carries it: trust is decided by the
    same rules whoever wrote the bytes."""

    format: str = attrs.field(validator=_artifact_text)
    path: str = attrs.field(validator=_artifact_text)
    digest: str = attrs.field(validator=_artifact_text)


def _optional_artifact(instance: object, attribute: attrs.Attribute[Artifact | None], value: Artifact | None) -> None:
    if value is not None and not isinstance(value, Artifact):
        raise TypeError(f"{attribute.name} must be a scout.gate.model.Artifact or None, got {type(value).__name__} "
                        f"{value!r} (GATE-35)")


@attrs.frozen(cache_hash=True)
class CheckpointCaptured:
    """A checkpoint's bytes are complete on stable storage at ``step``; ``artifact`` says where,
    when the framework wrote them (FRAME-6; None: scout's own DCP checkpoint)."""

    trigger: ClassVar[str] = "capture"
    step: int = attrs.field(validator=_step_value)
    artifact: Artifact | None = attrs.field(default=None, validator=_optional_artifact)


@attrs.frozen(cache_hash=True)
class CycleBoundary:
    """The replay scheduler closes the open cycle at ``step`` and opens the next there."""

    trigger: ClassVar[str] = "boundary"
    step: int = attrs.field(validator=_step_value)


def _failure_class(instance: object, attribute: attrs.Attribute[FailureClass], value: FailureClass) -> None:
    if not isinstance(value, FailureClass):
        raise TypeError(f"{attribute.name} must be a scout.core.failure.FailureClass member "
                        f"({', '.join(f'FailureClass.{f.name}' for f in FailureClass)}), got "
                        f"{type(value).__name__} {value!r} (GATE-36)")


@attrs.frozen(cache_hash=True)
class Restart:
    """The job restarts from the restorable checkpoint at ``step`` (None: from initialization)
    after a failure of class ``cause`` (GATE-36: UNCERTAIN when nothing says why the previous
    attempt ended)."""

    trigger: ClassVar[str] = "restart"
    step: int | None = attrs.field(validator=attrs.validators.optional(_step_value))
    cause: FailureClass = attrs.field(default=FailureClass.UNCERTAIN, validator=_failure_class)


@attrs.frozen(cache_hash=True)
class CheckpointLost:
    """GATE-42: the restorable checkpoint ``checkpoint`` has no complete files where it was
    saved (``restore()`` looked, spec/recovery.md RECOVERY-7); ``detail`` says where and what
    was missing, for the trust log."""

    trigger: ClassVar[str] = "lose"
    checkpoint: CheckpointId
    detail: str = ""

    def __attrs_post_init__(self) -> None:
        if not isinstance(self.checkpoint, CheckpointId):
            raise TypeError(f"CheckpointLost.checkpoint must be a CheckpointId, got {type(self.checkpoint).__name__} "
                            f"{self.checkpoint!r} (GATE-35)")
        if not isinstance(self.detail, str):
            raise TypeError(f"CheckpointLost.detail must be a str, got {self.detail!r}")


GateEvent = RecipeVerdicts | CheckpointCaptured | CycleBoundary | Restart | CheckpointLost

# ------------------------------------------------------------------------------------------
# Records
# ------------------------------------------------------------------------------------------


@attrs.frozen(cache_hash=True)
class Replay:
    """One accepted replay in a clean cycle: what a certificate lists."""

    recipe: str
    step: int
    verdicts: tuple[GroupVerdict, ...]


@attrs.frozen(cache_hash=True)
class CycleRecord:
    """A closed cycle, complete and clean: the recipes replayed in it, at which steps, with
    which verdicts from which peer groups."""

    cycle: int
    start_step: int
    end_step: int
    replays: tuple[Replay, ...]

    @property
    def recipes_replayed(self) -> frozenset[str]:
        return frozenset(replay.recipe for replay in self.replays)


@attrs.frozen(cache_hash=True)
class Certificate:
    """Coverage certificate of a RECOVERY_VERIFIED checkpoint (docs/design.md §2.3): it claims no more
    than the replays of the cycle before its capture and the cycle after."""

    checkpoint: CheckpointId
    recipes: tuple[str, ...]
    groups: tuple[str, ...]
    before: CycleRecord
    after: CycleRecord
    promoted_at_step: int


@attrs.frozen(cache_hash=True)
class SdcRecord:
    """The first SDC seen since the last restart: why the gate is TAINTED."""

    recipe: str
    cycle: int
    step: int
    groups: tuple[str, ...]

    def describe(self) -> str:
        return f"SDC attributed by group(s) {', '.join(self.groups)} in recipe {self.recipe!r} at step {self.step} (cycle {self.cycle})"


@attrs.frozen(cache_hash=True)
class CheckpointEntry:
    """A checkpoint the gate knows, its trust, and why. ``before`` is the complete clean cycle
    that ended at its capture (CANDIDATE only); ``certificate`` is set once verified;
    ``artifact`` is the framework's checkpoint the capture named (GATE-17, FRAME-6)."""

    id: CheckpointId
    trust: Trust
    reason: str
    before: CycleRecord | None = None
    certificate: Certificate | None = None
    artifact: Artifact | None = None


# ------------------------------------------------------------------------------------------
# Effects (executed by a driver; spec/gate.md "Effects")
# ------------------------------------------------------------------------------------------


@attrs.frozen(cache_hash=True)
class Persist:
    """Write the gate state durably (the manifest) before acting on the other effects of this
    step. Emitted first by every step that changes the state (GATE-9)."""


@attrs.frozen(cache_hash=True)
class TrustChange:
    """A checkpoint entered a trust state (``before`` None: it was just captured). Promotion is
    ``after == RECOVERY_VERIFIED`` and carries the certificate; quarantine is ``after ==
    QUARANTINED``."""

    checkpoint: CheckpointId
    before: Trust | None
    after: Trust
    reason: str
    certificate: Certificate | None = None


@attrs.frozen(cache_hash=True)
class GateReport:
    """Tell people and the job manager. ``sdc`` and ``unchecked`` are never merged (GATE-5)."""

    kind: GateReportKind
    cycle: int
    step: int
    recipes: tuple[str, ...]
    groups: tuple[str, ...]
    detail: str


#: GATE-37: every effect the gate emits; a driver dispatches over exactly these.
GateEffect = Persist | TrustChange | GateReport


# ------------------------------------------------------------------------------------------
# The gate's extended state
# ------------------------------------------------------------------------------------------


@attrs.frozen(cache_hash=True)
class GateContext:
    """Everything the gate knows besides its control state (spec/gate.md, "Context").

    ``replays`` holds the open cycle's replays only while every one of them is clean: an unclean
    cycle can certify nothing, so its details live in reports, not in the state.
    """

    config: GateConfig
    timeline: int = 0
    cycle: int = 0  # the open cycle's number, or the last one's when none is open
    cycle_start_step: int | None = None  # None: no cycle open (IDLE)
    covered: tuple[str, ...] = ()  # recipes with an accepted result in the open cycle
    unchecked: tuple[str, ...] = ()  # recipes with an unchecked result in the open cycle
    replays: tuple[Replay, ...] = ()
    previous_clean: CycleRecord | None = None  # the complete clean cycle that ended at cycle_start_step
    checkpoints: tuple[CheckpointEntry, ...] = ()
    last_step: int = 0  # the highest step any accepted event carried in this timeline
    last_capture_step: int | None = None  # captures in this timeline must be newer
    sdc: SdcRecord | None = None
    restart_cause: FailureClass | None = None  # GATE-36: why this timeline began (None: the first start)

    def replace(self, **changes: Any) -> GateContext:
        """``attrs.evolve`` without its per-call introspection: the explorer builds millions."""
        values = {name: getattr(self, name) for name in _CONTEXT_FIELDS}
        values.update(changes)
        return GateContext(**values)

    @property
    def candidate(self) -> CheckpointEntry | None:
        for entry in self.checkpoints:
            if entry.trust is Trust.CANDIDATE:
                return entry
        return None

    @property
    def verified(self) -> CheckpointEntry | None:
        """The newest RECOVERY_VERIFIED checkpoint."""
        best: CheckpointEntry | None = None
        for entry in self.checkpoints:
            if entry.trust is Trust.RECOVERY_VERIFIED and (best is None or entry.id.step > best.id.step):
                best = entry
        return best

    @property
    def verified_step(self) -> int | None:
        verified = self.verified
        return None if verified is None else verified.id.step

    @property
    def latest(self) -> CheckpointEntry | None:
        """The newest restorable checkpoint (any trust in RESTORABLE)."""
        best: CheckpointEntry | None = None
        for entry in self.checkpoints:
            if entry.trust in RESTORABLE and (best is None or entry.id.step > best.id.step):
                best = entry
        return best

    @property
    def cycle_complete(self) -> bool:
        return len(self.covered) == len(self.config.recipes)

    def entry(self, checkpoint: CheckpointId) -> CheckpointEntry | None:
        for entry in self.checkpoints:
            if entry.id == checkpoint:
                return entry
        return None


_CONTEXT_FIELDS: Final = tuple(field.name for field in attrs.fields(GateContext))


def is_complete_and_clean(config: GateConfig, record: CycleRecord) -> bool:
    """A closed cycle certifies only if every recipe was replayed in it, every replay lies inside
    it, and every applicable peer group agreed on every replay (GATE-1, GATE-8)."""
    if record.start_step >= record.end_step:
        return False
    if record.recipes_replayed != frozenset(config.recipe_ids):
        return False
    for replay in record.replays:
        if not record.start_step <= replay.step <= record.end_step:
            return False
        if tuple(verdict.group for verdict in replay.verdicts) != config.groups_of(replay.recipe):
            return False
        if any(verdict.outcome is not Outcome.AGREE for verdict in replay.verdicts):
            return False
    return True
