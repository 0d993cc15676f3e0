"""Recipe catalog, replay schedule, readiness decision and coverage (spec/replay.md, REC-*,
READY-*, EVID-*). Pure: no torch, no clock, no I/O.

A *recipe* is one unit of replayed work that equivalent peers can compare: the embedding, one
hidden layer, the output head, or one slice of the optimizer update. The *schedule* says, as a
function of the step number alone, which recipes are due -- so every peer, and a peer that
restarts, computes the same answer without exchanging anything. The torch side
(``scout.replay``) captures and replays; this module decides.

Every vote goes through :func:`scout.core.verdict.classify_exact` (docs/design.md §2.1): readiness
digests, replay status codes and evidence signatures alike. Nothing here counts a majority.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from typing import Final

import attrs

from scout.core.guards import whole_number
from scout.core.self_check import SelfCheckOutcome, decide_self_check
from scout.core.verdict import MISSING, Reason, Status, Verdict, classify_exact

__all__ = [
    "CLASS_ORDER",
    "Catalog",
    "Coverage",
    "DueRecipe",
    "EvidenceKind",
    "Intervals",
    "ReadinessDecision",
    "RecipeClass",
    "RecipeId",
    "RecipeResult",
    "ReplayStatus",
    "Schedule",
    "Segment",
    "combine_evidence",
    "coverage",
    "decide_readiness",
    "optimizer_window",
]


class RecipeClass(enum.Enum):
    """REC-1. The declaration order is the slot order of every fixed-layout exchange."""

    EMBEDDING = "embedding"
    HIDDEN = "hidden"
    OUTPUT = "output"
    OPTIMIZER = "optimizer"
    EXPERT = "expert"  # MOE-1: one routed expert at one per-expert row count n_exec
    # Job-level checks run at cycle ends, not scheduled by a rank's catalog (never pending in
    # coverage; the gate's catalog lists them like any recipe): the all-to-all replay (MOE-8)
    # and the golden canary (CANARY-1).
    DISPATCH = "dispatch"
    CANARY = "canary"


CLASS_ORDER: Final = tuple(RecipeClass)
#: Classes a rank's catalog schedules (REC-1, MOE-1); the others are job-level checks.
SCHEDULED_CLASSES: Final = (RecipeClass.EMBEDDING, RecipeClass.HIDDEN, RecipeClass.OUTPUT,
                            RecipeClass.OPTIMIZER, RecipeClass.EXPERT)
_INDEXED: Final = frozenset({RecipeClass.HIDDEN, RecipeClass.OPTIMIZER, RecipeClass.EXPERT})


@attrs.frozen(order=True)
class RecipeId:
    """``embedding``, ``hidden.<layer>``, ``output``, ``optimizer.<slice>`` (REC-1) or
    ``expert.<slot>@<n_exec>`` (MOE-1: expert slot ``slot`` of this rank -- MoE layer major,
    local expert minor -- replayed at ``n_exec`` rows)."""

    recipe_class: RecipeClass = attrs.field(order=CLASS_ORDER.index)
    index: int = 0
    n_exec: int = 0  # expert recipes only: the per-expert row count replayed (MOE-2)

    def __attrs_post_init__(self) -> None:
        if self.index < 0:
            raise ValueError(f"recipe index must be >= 0, got {self.index}")
        if self.recipe_class not in _INDEXED and self.index != 0:
            raise ValueError(f"{self.recipe_class.value} has one recipe; got index {self.index}")
        if self.recipe_class is RecipeClass.EXPERT:
            if not whole_number(self.n_exec) or self.n_exec < 1:
                raise ValueError(f"an expert recipe needs n_exec >= 1 rows, got {self.n_exec!r}")
        elif self.n_exec != 0:
            raise ValueError(f"only expert recipes take n_exec; {self.recipe_class.value} got {self.n_exec}")

    def __str__(self) -> str:
        if self.recipe_class is RecipeClass.EXPERT:
            return f"expert.{self.index}@{self.n_exec}"
        if self.recipe_class in _INDEXED:
            return f"{self.recipe_class.value}.{self.index}"
        return str(self.recipe_class.value)

    @classmethod
    def parse(cls, text: str) -> RecipeId:
        name, _, index = text.partition(".")
        try:
            recipe_class = RecipeClass(name)
        except ValueError:
            known = ", ".join(c.value for c in RecipeClass)
            raise ValueError(f"unknown recipe {text!r}: the classes are {known}") from None
        if recipe_class is RecipeClass.EXPERT:
            slot, _, rows = index.partition("@")
            if not (slot.isdigit() and rows.isdigit()):
                raise ValueError(f"recipe {text!r}: an expert recipe is expert.<slot>@<n_exec>, e.g. expert.0@64")
            return cls(recipe_class, int(slot), int(rows))
        if recipe_class in _INDEXED:
            if not index.isdigit():
                raise ValueError(f"recipe {text!r} needs an index, e.g. {name}.0")
            return cls(recipe_class, int(index))
        if index:
            raise ValueError(f"recipe {text!r}: {name} takes no index")
        return cls(recipe_class)


def _non_negative(_instance: object, attribute: attrs.Attribute[int], value: int) -> None:
    if not whole_number(value) or value < 0:
        raise ValueError(f"{attribute.name} must be an int >= 0, got {value!r}")


def _positive(_instance: object, attribute: attrs.Attribute[int], value: int) -> None:
    if not whole_number(value) or value < 1:
        raise ValueError(f"{attribute.name} must be an int >= 1, got {value!r}")


def _expert_keys(value: Sequence[tuple[int, int]]) -> tuple[tuple[int, int], ...]:
    return tuple((int(slot), int(n_exec)) for slot, n_exec in value)


@attrs.frozen
class Catalog:
    """What can be replayed on this rank (REC-1, REC-5).

    ``has_embedding`` / ``has_output`` False means *not applicable on this rank* (a pipeline
    stage that owns no embedding): the class is left out of the catalog and of every coverage
    claim. That is different from *not ready* (a recipe that is in the catalog but could not be
    captured this time), which makes the check Inconclusive.
    """

    hidden_layer_count: int = attrs.field(validator=_non_negative)
    has_embedding: bool = True
    has_output: bool = True
    optimizer_slice_count: int = attrs.field(default=1, validator=_non_negative)
    #: MOE-1: the expert recipes as ``(slot, n_exec)`` pairs, in replay order (a regime
    #: catalog's representatives, MOE-5); empty: no experts on this rank.
    expert_keys: tuple[tuple[int, int], ...] = attrs.field(default=(), converter=_expert_keys)

    def __attrs_post_init__(self) -> None:
        if len(set(self.expert_keys)) != len(self.expert_keys):
            raise ValueError(f"expert keys repeat: {list(self.expert_keys)}")
        for slot, n_exec in self.expert_keys:  # RecipeId validates each key
            RecipeId(RecipeClass.EXPERT, slot, n_exec)

    def class_size(self, recipe_class: RecipeClass) -> int:
        """Number of recipes of a class on this rank (0 = not applicable)."""
        if recipe_class is RecipeClass.EMBEDDING:
            return int(self.has_embedding)
        if recipe_class is RecipeClass.HIDDEN:
            return self.hidden_layer_count
        if recipe_class is RecipeClass.OUTPUT:
            return int(self.has_output)
        if recipe_class is RecipeClass.EXPERT:
            return len(self.expert_keys)
        if recipe_class is RecipeClass.OPTIMIZER:
            return self.optimizer_slice_count
        return 0

    def recipe_at(self, recipe_class: RecipeClass, index: int) -> RecipeId:
        """The ``index``-th recipe of a class (REC-3's ``k mod n_c``)."""
        if recipe_class is RecipeClass.EXPERT:
            slot, n_exec = self.expert_keys[index]
            return RecipeId(recipe_class, slot, n_exec)
        return RecipeId(recipe_class, index)

    def recipes(self) -> tuple[RecipeId, ...]:
        return tuple(
            self.recipe_at(recipe_class, index)
            for recipe_class in CLASS_ORDER
            for index in range(self.class_size(recipe_class))
        )

    def not_applicable(self) -> tuple[RecipeClass, ...]:
        return tuple(c for c in SCHEDULED_CLASSES if self.class_size(c) == 0)


@attrs.frozen
class Intervals:
    """REC-2: steps between two checks of each class; 0 disables the class."""

    embedding_steps: int = attrs.field(default=50, validator=_non_negative)
    # 50, not 10: one full layer every 10 steps cost ~1.8 % of a step for an 8-layer model
    # and every 25 still ~1.1 % (milestone 1's replay-only benchmark); at 50 every class is due at the same step,
    # one check round per 50 steps, and the estimate is <= 1 % (spec/replay.md REC-2).
    hidden_steps: int = attrs.field(default=50, validator=_non_negative)
    output_steps: int = attrs.field(default=50, validator=_non_negative)
    optimizer_steps: int = attrs.field(default=50, validator=_non_negative)
    expert_steps: int = attrs.field(default=50, validator=_non_negative)  # MOE-1
    #: REC-3, MOE-10: expert recipes replayed at each expert check (every other class: one).
    expert_recipes_per_check: int = attrs.field(default=1, validator=_positive)
    #: REC-3, BUDGET-2: hidden recipes replayed at each hidden check (the budget's lanes).
    hidden_recipes_per_check: int = attrs.field(default=1, validator=_positive)

    def per_check(self, recipe_class: RecipeClass) -> int:
        """REC-3's ``m_c``: recipes of ``recipe_class`` replayed at each of its checks."""
        if recipe_class is RecipeClass.EXPERT:
            return self.expert_recipes_per_check
        return self.hidden_recipes_per_check if recipe_class is RecipeClass.HIDDEN else 1

    def for_class(self, recipe_class: RecipeClass) -> int:
        name = _INTERVAL_FIELDS.get(recipe_class)
        return 0 if name is None else int(getattr(self, name))


#: Intervals' field of each scheduled class (the job-level classes have none: 0).
_INTERVAL_FIELDS: Final = {
    RecipeClass.EMBEDDING: "embedding_steps",
    RecipeClass.HIDDEN: "hidden_steps",
    RecipeClass.OUTPUT: "output_steps",
    RecipeClass.OPTIMIZER: "optimizer_steps",
    RecipeClass.EXPERT: "expert_steps",
}


@attrs.frozen
class DueRecipe:
    """A recipe due at ``step``; ``check_index`` counts the checks of its class (REC-3)."""

    recipe: RecipeId
    step: int
    check_index: int


@attrs.frozen
class Schedule:
    """REC-2..REC-4: which recipes are due at a step, as a pure function of the step."""

    catalog: Catalog
    intervals: Intervals = Intervals()
    #: REC-3, BUDGET-5: steps are counted from this step (a cadence that starts at a cycle
    #: boundary of the job counts from that boundary); 0 for a schedule that starts with the job.
    origin_step: int = attrs.field(default=0, validator=_non_negative)
    #: Per active class, in class order: (class, interval, size, recipes per check) -- computed
    #: once, because ``due`` runs at every training step (issue 38: the fixed per-step cost).
    _plan: tuple[tuple[RecipeClass, int, int, int], ...] = attrs.field(init=False, repr=False, eq=False)
    #: The last two steps asked and their answers: a job step asks its step and the next one several
    #: times, interleaved (its checks, the runner's arming of the next step, the calibration) -- the
    #: answer is a pure function of the step.
    _last_due: list[tuple[int, tuple[DueRecipe, ...]]] = attrs.field(
        init=False, repr=False, eq=False, factory=lambda: [(0, ()), (0, ())])

    def __attrs_post_init__(self) -> None:
        plan = tuple((c, self.intervals.for_class(c), self.catalog.class_size(c), self.intervals.per_check(c))
                     for c in CLASS_ORDER)
        object.__setattr__(self, "_plan", tuple(row for row in plan if row[1] > 0 and row[2] > 0))

    def active_classes(self) -> tuple[RecipeClass, ...]:
        """Classes that are applicable and enabled."""
        return tuple(row[0] for row in self._plan)

    def due(self, step: int) -> tuple[DueRecipe, ...]:
        """REC-3: counted from the origin ``o`` (``s' = s - o >= 1``), class ``c`` is due at
        step ``s`` iff ``s' % interval_c == 0``; the ``k``-th check of the class
        (``k = s' // interval_c - 1``) replays recipes ``(k * m_c + j) mod n_c`` for
        ``j < min(m_c, n_c)`` (``m_c`` = 1 but for the hidden lanes, BUDGET-2, and the experts,
        MOE-10). In class order, and within a class in ``j`` order."""
        last = self._last_due  # each entry one tuple, replaced whole: safe from any thread
        for asked, answer in last:
            if step == asked != 0 and type(step) is int:  # 0: nothing asked yet (and no step)
                return answer
        if not whole_number(step) or step < 1:
            raise ValueError(f"steps are numbered from 1, got {step!r}")
        counted = step - self.origin_step
        if counted < 1:
            raise ValueError(f"step {step} is not after this schedule's origin, step {self.origin_step}")
        due: list[DueRecipe] = []
        for recipe_class, interval, size, per_check in self._plan:
            if counted % interval:
                continue
            check_index = counted // interval - 1
            for lane in range(min(per_check, size)):
                index = (check_index * per_check + lane) % size
                due.append(DueRecipe(self.catalog.recipe_at(recipe_class, index), step, check_index))
        answer = tuple(due)
        last[1] = last[0]
        last[0] = (step, answer)
        return answer

    def class_cycle_steps(self, recipe_class: RecipeClass) -> int:
        """REC-4: ``ceil(n_c / m_c) * i_c``, the steps class ``c`` takes to replay every recipe
        once (0 when it is not active)."""
        if recipe_class not in self.active_classes():
            return 0
        size, per_check = self.catalog.class_size(recipe_class), self.intervals.per_check(recipe_class)
        return -(-size // per_check) * self.intervals.for_class(recipe_class)

    def cycle_length_steps(self) -> int:
        """REC-4: any window of this many consecutive steps schedules every recipe of every
        active class at least once (0 when nothing is active)."""
        return max((self.class_cycle_steps(c) for c in self.active_classes()), default=0)

    def uncovered(self) -> tuple[RecipeId, ...]:
        """Applicable recipes that are never scheduled (their class interval is 0)."""
        active = set(self.active_classes())
        return tuple(r for r in self.catalog.recipes() if r.recipe_class not in active)

    def describe(self) -> tuple[object, ...]:
        """The schedule contract (READY-1): peers must agree on it before any check."""
        return (
            "scout-replay-schedule",
            1,
            tuple(
                (c.value, self.catalog.class_size(c), self.intervals.for_class(c))
                for c in CLASS_ORDER
            ),
            self.catalog.expert_keys,
        ) + (  # appended only when not 1, so the digests of schedules without lanes are unchanged
            (("expert_recipes_per_check", self.intervals.expert_recipes_per_check),)
             if self.intervals.expert_recipes_per_check != 1 else ()) + (
            (("hidden_recipes_per_check", self.intervals.hidden_recipes_per_check),)
            if self.intervals.hidden_recipes_per_check != 1 else ()) + (
            (("origin_step", self.origin_step),) if self.origin_step else ())


@attrs.frozen
class Segment:
    """Elements ``[start, stop)`` of the flattened parameter ``parameter_index``."""

    parameter_index: int
    start: int
    stop: int


def optimizer_window(
    check_index: int, parameter_numels: Sequence[int], slice_numel: int
) -> tuple[Segment, ...]:
    """REC-6: the optimizer slice replayed at the ``check_index``-th optimizer check.

    The parameters are laid end to end in their optimizer order; check ``k`` takes the
    ``slice_numel`` elements starting at ``(k * slice_numel) mod total``, wrapping to the first
    parameter. After ``ceil(total / slice_numel)`` checks every element has been replayed.
    """
    if check_index < 0:
        raise ValueError(f"check_index must be >= 0, got {check_index}")
    if slice_numel < 1:
        raise ValueError(f"slice_numel must be >= 1, got {slice_numel}")
    if any(n < 0 for n in parameter_numels):
        raise ValueError(f"parameter sizes must be >= 0, got {list(parameter_numels)}")
    total = sum(parameter_numels)
    if total == 0:
        return ()
    want = min(slice_numel, total)
    position = (check_index * slice_numel) % total
    starts = []
    offset = 0
    for numel in parameter_numels:
        starts.append(offset)
        offset += numel
    segments: list[Segment] = []
    while want > 0:
        index = max(i for i, s in enumerate(starts) if s <= position and parameter_numels[i] > 0)
        local = position - starts[index]
        take = min(want, parameter_numels[index] - local)
        segments.append(Segment(index, local, local + take))
        want -= take
        position = (position + take) % total
    return tuple(segments)


# --------------------------------------------------------------------------------------------
# Readiness (READY-*)
# --------------------------------------------------------------------------------------------


class ReplayStatus(enum.IntEnum):
    """Per-peer status of one recipe in one check; travels as an int (EVID-2)."""

    OK = 0
    NOT_DUE = 1
    NOT_READY = 2  # in the catalog, but nothing usable was captured
    CAPTURE_TOO_LARGE = 3
    REPLAY_FAILED = 4  # the replay raised
    NONDETERMINISTIC = 5  # a nondeterministic kernel was refused inside replay
    NOT_APPLICABLE = 6


@attrs.frozen
class ReadinessDecision:
    """READY-2: ``proceed`` is identical on every peer that saw the same gathered values."""

    proceed: bool
    verdict: Verdict
    reason: str | None
    not_ready: tuple[int, ...] = ()


def decide_readiness(
    digests: Sequence[int | object], statuses: Sequence[int | object]
) -> ReadinessDecision:
    """READY-2..READY-5: replay only if every peer is ready (status OK) and every peer's
    description digest agrees (exact verdict AGREE). ``MISSING`` marks a peer that has no such
    recipe due, or did not answer. Readiness never attributes a culprit: a peer that is not
    ready or describes other work makes the check Inconclusive -- it is not evidence of
    corruption (docs/prior-art.md lesson 4)."""
    if len(digests) != len(statuses):
        raise ValueError(f"{len(digests)} digests but {len(statuses)} status codes")
    verdict = classify_exact(digests)
    not_ready = tuple(i for i, code in enumerate(statuses) if code != ReplayStatus.OK)
    if not_ready:
        return ReadinessDecision(
            False, verdict, "not-ready: " + _status_reason(statuses), not_ready
        )
    if verdict.status is not Status.AGREE:
        if verdict.status is Status.ATTRIBUTED:
            reason = f"readiness-mismatch: peers {list(verdict.outliers)} describe other work"
        else:
            assert verdict.reason is not None
            reason = f"readiness-{verdict.reason.value}"
        return ReadinessDecision(False, verdict, reason, not_ready)
    return ReadinessDecision(True, verdict, None)


# --------------------------------------------------------------------------------------------
# Evidence (EVID-*) and results
# --------------------------------------------------------------------------------------------


class EvidenceKind(enum.Enum):
    """EVID-3: the evidence groups of a recipe, compared separately."""

    PARAMETERS = "parameters"  # the live parameters (or optimizer slice inputs) before replay
    INPUT = "input"  # the replay inputs after the broadcast
    RNG = "rng"  # the installed RNG state
    OUTPUT = "output"
    INPUT_GRADIENT = "input_gradient"
    PARAMETER_GRADIENT = "parameter_gradient"
    UPDATED = "updated"  # optimizer replay: updated parameter slice and state
    LIVE_UPDATED = "live_updated"  # optimizer: the live parameters after the real step
    # SELF-1: each peer's code (scout.core.self_check.LiveCheck) -- did its live output equal
    # its own replay of the call? Not a signature: voted by decide_self_check (SELF-4).
    LIVE = "live"


@attrs.frozen
class RecipeResult:
    """One recipe's verdict at one step: what the gate consumes (EVID-5).

    ``status``: AGREE (accepted), ATTRIBUTED (corruption observed: ``outliers`` are peer
    positions, ``sources`` the evidence groups that named them) or INCONCLUSIVE (could not
    check; ``reason`` says why). Inconclusive is never reported as corruption.
    ``self_checked``: every peer's live output was reproduced by its own replay (SELF-4, SELF-7).
    """

    recipe: RecipeId
    step: int
    status: Status
    outliers: tuple[int, ...] = ()
    sources: tuple[str, ...] = ()
    reason: str | None = None
    self_checked: bool = False

    @property
    def accepted(self) -> bool:
        return self.status is Status.AGREE


def _status_reason(codes: Sequence[int | object]) -> str:
    """Peers whose status is not OK, as ``position:name`` (e.g. ``1:capture_too_large``)."""
    names = []
    for position, code in enumerate(codes):
        if code is MISSING:
            names.append(f"{position}:missing")
        elif code != ReplayStatus.OK:
            try:
                label = ReplayStatus(code).name.lower()  # type: ignore[arg-type]
            except ValueError:
                label = f"code-{code}"
            names.append(f"{position}:{label}")
    return ",".join(names)


def combine_evidence(
    recipe: RecipeId,
    step: int,
    status_codes: Sequence[int | object],
    evidence: Mapping[EvidenceKind, Sequence[int | object]],
) -> RecipeResult:
    """EVID-2..EVID-4: one recipe's result from every peer's status code and evidence.

    1. The status codes are voted exactly. Unless every peer reports OK the recipe is
       INCONCLUSIVE ("could not check"): a replay that raised or refused a nondeterministic
       kernel is not evidence of corruption.
    2. Each evidence group is voted exactly, separately. Any ATTRIBUTED group makes the recipe
       ATTRIBUTED with the union of outliers; otherwise any INCONCLUSIVE group makes it
       INCONCLUSIVE; otherwise AGREE. The ``live`` group holds self-check codes, not
       signatures: its one exact vote is read by :func:`decide_self_check` (SELF-4), and when
       no peer took part it contributes nothing.
    """
    if not status_codes:
        raise ValueError("no peers: a recipe result needs at least one status code")
    status_verdict = classify_exact(list(status_codes))
    if not (
        status_verdict.status is Status.AGREE and status_verdict.healthy_value == ReplayStatus.OK
    ):
        if (
            status_verdict.status is Status.INCONCLUSIVE
            and status_verdict.reason is Reason.SINGLETON
        ):
            return RecipeResult(recipe, step, Status.INCONCLUSIVE, reason="singleton")
        return RecipeResult(
            recipe,
            step,
            Status.INCONCLUSIVE,
            reason="replay-status " + _status_reason(status_codes),
        )
    outliers: set[int] = set()
    sources: list[str] = []
    inconclusive: list[str] = []
    self_checked = False
    for kind in EvidenceKind:
        if kind not in evidence:
            continue
        values = evidence[kind]
        if len(values) != len(status_codes):
            raise ValueError(
                f"evidence {kind.value} has {len(values)} values for {len(status_codes)} peers"
            )
        if kind is EvidenceKind.LIVE:
            live = decide_self_check(list(values))
            status, found, why = live.status, live.outliers, live.reason
            self_checked = live.outcome is SelfCheckOutcome.AGREE
        else:
            verdict = classify_exact(list(values))
            status, found = verdict.status, verdict.outliers
            why = None if verdict.reason is None else verdict.reason.value
        if status is Status.ATTRIBUTED:
            outliers.update(found)
            sources.append(kind.value)
        elif status is Status.INCONCLUSIVE:
            inconclusive.append(f"{kind.value}:{why}")
    if outliers:
        return RecipeResult(
            recipe, step, Status.ATTRIBUTED, tuple(sorted(outliers)), tuple(sources)
        )
    if inconclusive:
        return RecipeResult(recipe, step, Status.INCONCLUSIVE, reason=" ".join(inconclusive))
    if not evidence:
        return RecipeResult(recipe, step, Status.INCONCLUSIVE, reason="no-evidence-groups")
    return RecipeResult(recipe, step, Status.AGREE, self_checked=self_checked)


# --------------------------------------------------------------------------------------------
# Coverage (REC-4)
# --------------------------------------------------------------------------------------------


@attrs.frozen
class Coverage:
    """What the results since ``since_step`` (exclusive) establish about the catalog."""

    since_step: int
    accepted: tuple[tuple[RecipeId, int], ...]  # recipe, step of its latest accepted result
    pending: tuple[RecipeId, ...]  # applicable recipes with no accepted result yet
    attributed: tuple[RecipeResult, ...]
    inconclusive: tuple[RecipeResult, ...]
    not_applicable: tuple[RecipeClass, ...]

    @property
    def complete(self) -> bool:
        """Every applicable recipe has an accepted result since ``since_step``."""
        return not self.pending

    @property
    def clean(self) -> bool:
        """No corruption observed and nothing failed to check since ``since_step``."""
        return not self.attributed and not self.inconclusive


def coverage(catalog: Catalog, results: Sequence[RecipeResult], since_step: int) -> Coverage:
    """REC-4: coverage of ``catalog`` by the results of steps after ``since_step``."""
    known = set(catalog.recipes())
    latest: dict[RecipeId, int] = {}
    attributed: list[RecipeResult] = []
    inconclusive: list[RecipeResult] = []
    for result in results:
        if result.step <= since_step:
            continue
        if result.recipe not in known:
            raise ValueError(
                f"result for {result.recipe} at step {result.step}: not in this rank's catalog"
            )
        if result.status is Status.AGREE:
            latest[result.recipe] = max(latest.get(result.recipe, 0), result.step)
        elif result.status is Status.ATTRIBUTED:
            attributed.append(result)
        else:
            inconclusive.append(result)
    return Coverage(
        since_step=since_step,
        accepted=tuple(sorted(latest.items())),
        pending=tuple(r for r in catalog.recipes() if r not in latest),
        attributed=tuple(attributed),
        inconclusive=tuple(inconclusive),
        not_applicable=catalog.not_applicable(),
    )
