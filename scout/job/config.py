"""``scout.attach``'s configuration: every key, its default, and why (docs/attach.md).

The same keys come, in rising priority, from the defaults below, a TOML file
(``config="scout.toml"``; keys at the top level or under ``[scout]``, not both), environment
variables ``SCOUT_<KEY>`` (upper case) and keyword arguments of ``scout.attach``. Every value is
checked when the job attaches, and an error names the key, the value, where it came from (the
keyword, the variable, or the file and line) and what is allowed. A ``SCOUT_*`` variable that is
not a setting but looks like one (``SCOUT_STALL_TRESHOLD_S``) is an error with the setting it
probably meant: a misspelt variable must never leave the user believing a policy is on. No
torch here.
"""

from __future__ import annotations

import difflib
import os
import re
import shlex
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

import attrs

from scout.core.finite import finite_number
from scout.core.guards import whole_number
from scout.core.observer.model import (
    CHECKPOINT_STALL_THRESHOLD_S_DEFAULT,
    DATA_STALL_THRESHOLD_S_DEFAULT,
    RECHECK_INTERVAL_S_DEFAULT,
    ROUND_DEADLINE_S_DEFAULT,
    STALL_THRESHOLD_S_DEFAULT,
)

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

__all__ = ["CONFIG_BYTES_MAX", "Config", "ConfigError", "OTHER_VARIABLES", "POLICIES", "load_config",
           "unknown_variables"]

POLICIES: Final = ("report", "restart")
CHECKPOINT_ERROR_POLICIES: Final = ("stop", "continue")
#: spec/recovery.md RECOVERY-7: what restore() does when the chosen checkpoint's files are gone.
MISSING_CHECKPOINT_POLICIES: Final = ("fallback", "stop")
CONFIG_BYTES_MAX: Final = 1 << 20
ENV_PREFIX: Final = "SCOUT_"
#: ``SCOUT_*`` variables that are not settings: the job's identity (RecordIdentity), adopting a
#: run directory, the signature path (scout/replay/_native.py), the simulator's memory budget,
#: and the variables of scout's own test, benchmark (scout/job/bench_switches.py) and GPU scripts
#: (prefixes ending in ``_``).
OTHER_VARIABLES: Final = (
    "SCOUT_JOB_ID", "SCOUT_GENERATION", "SCOUT_ADOPT_RUN_DIR", "SCOUT_SIGNATURE_PATH", "SCOUT_SIM_MEMORY_MIB",
    "SCOUT_REPORT_AUDIT_FILE", "SCOUT_TORCHRUN_DEVICE", "SCOUT_GPUS", "SCOUT_CASES", "SCOUT_GPU_GOALS",
    "SCOUT_CRASH_SEED", "SCOUT_TEST_", "SCOUT_BENCH_",
)
#: How alike an unknown variable's name must be to a setting's (difflib's ratio) to be taken
#: for a misspelling of it: ``SCOUT_ONSDC`` -> ``SCOUT_ON_SDC`` is 0.95, two unrelated names of
#: this length rarely pass 0.6.
_MISSPELLING_RATIO: Final = 0.8


class ConfigError(ValueError):
    """A configuration key or value scout cannot use; the message names both and the source."""


def _positive_s(name: str, maximum: float = 7 * 86400.0) -> Any:
    def check(_instance: object, _attribute: object, value: object) -> None:
        if not finite_number(value) or not 0 < value <= maximum:
            raise ConfigError(f"{name} must be a number of seconds in (0, {maximum:g}], got {value!r}")

    return check


def _seconds_or_zero(name: str, maximum: float) -> Any:
    def check(_instance: object, _attribute: object, value: object) -> None:
        if not finite_number(value) or not 0 <= value <= maximum:
            raise ConfigError(f"{name} must be a number of seconds in [0, {maximum:g}] (0: off), got {value!r}")

    return check


def _count(name: str, minimum: int, maximum: int) -> Any:
    def check(_instance: object, _attribute: object, value: object) -> None:
        if not whole_number(value) or not minimum <= value <= maximum:
            raise ConfigError(f"{name} must be an int in [{minimum}, {maximum}], got {value!r}")

    return check


def _optional_count(name: str, minimum: int, maximum: int, unset: str) -> Any:
    def check(_instance: object, _attribute: object, value: object) -> None:
        if value is not None and (not whole_number(value) or not minimum <= value <= maximum):
            raise ConfigError(f"{name} must be an int in [{minimum}, {maximum}], or unset ({unset}); got {value!r}")

    return check


def _share(name: str, maximum: float) -> Any:
    def check(_instance: object, _attribute: object, value: object) -> None:
        if not finite_number(value) or not 0 < value <= maximum:
            raise ConfigError(f"{name} must be a share of a step in (0, {maximum:g}] (0.01 is 1 %), got {value!r}")

    return check


def _choice(name: str, allowed: tuple[str, ...]) -> Any:
    def check(_instance: object, _attribute: object, value: object) -> None:
        if value not in allowed:
            raise ConfigError(f"{name} must be one of {', '.join(allowed)}, got {value!r}")

    return check


def _flag(name: str) -> Any:
    def check(_instance: object, _attribute: object, value: object) -> None:
        if not isinstance(value, bool):
            raise ConfigError(f"{name} must be true or false, got {value!r}")

    return check


def _optional_port(name: str) -> Any:
    def check(_instance: object, _attribute: object, value: object) -> None:
        if value is not None and (not whole_number(value) or not 0 <= value <= 65535):
            raise ConfigError(f"{name} must be a TCP port in [0, 65535] (0: any free port), or unset; got {value!r}")

    return check


def _optional_command(name: str) -> Any:
    def check(_instance: object, _attribute: object, value: object) -> None:
        if value is None:
            return
        if not isinstance(value, str) or not value.strip() or len(value) > 4096:
            raise ConfigError(f"{name} must be a command line of at most 4096 characters, or unset; got {value!r}")
        try:
            shlex.split(value)
        except ValueError as error:
            raise ConfigError(f"{name} {value!r} is not a valid command line: {error}") from None

    return check


def _optional_text(name: str) -> Any:
    def check(_instance: object, _attribute: object, value: object) -> None:
        if value is not None and (not isinstance(value, str) or not value.strip() or len(value) > 200):
            raise ConfigError(f"{name} must be a non-empty string of at most 200 characters, or unset; got {value!r}")

    return check


def _module_names(name: str) -> Any:
    def check(_instance: object, _attribute: object, value: object) -> None:
        if value is not None and (not isinstance(value, str) or len(value) > 20_000
                                  or not all(n.strip() for n in value.split(","))):
            raise ConfigError(f"{name} must be comma-separated module names (model.named_modules()), or unset; "
                              f"got {value!r}")

    return check


@attrs.frozen(kw_only=True)
class Config:
    """Everything a job can tune. The defaults serve a real job without tuning (docs/attach.md
    gives the reasoning for each)."""

    #: Idle time after which an observer opens a round (a hang is reported about this long after
    #: it began). The defaults of these five live with the observer's config
    #: (scout/core/observer/model.py, ``*_DEFAULT``: one home, the same for a bare observer), which
    #: says why 10 s.
    stall_threshold_s: float = attrs.field(default=STALL_THRESHOLD_S_DEFAULT, validator=_positive_s("stall_threshold_s"))
    data_stall_threshold_s: float = attrs.field(default=DATA_STALL_THRESHOLD_S_DEFAULT,
                                                validator=_positive_s("data_stall_threshold_s"))
    #: Checkpoint reads and writes, and the job's start-up (published as a checkpoint read).
    checkpoint_stall_threshold_s: float = attrs.field(
        default=CHECKPOINT_STALL_THRESHOLD_S_DEFAULT, validator=_positive_s("checkpoint_stall_threshold_s"))
    #: A round ends when every peer answered or this long after it opened.
    round_deadline_s: float = attrs.field(default=ROUND_DEADLINE_S_DEFAULT,
                                          validator=_positive_s("round_deadline_s", 60.0))
    #: While a stall lasts, rounds repeat this often (one report per stuck position).
    recheck_interval_s: float = attrs.field(default=RECHECK_INTERVAL_S_DEFAULT,
                                            validator=_positive_s("recheck_interval_s", 600.0))
    #: The share of a step's wall time scout may take on this job (spec/budget.md): scout measures
    #: what it costs during the first replay cycle and picks the replay cadence -- the interval,
    #: and hidden layers per check -- that keeps it inside, then says what that cadence buys.
    overhead_budget: float = attrs.field(default=0.01, validator=_share("overhead_budget", 0.5))
    #: Steps between two replay checks (1 = every step), one hidden layer per check, so a replay
    #: cycle -- every recipe once -- is ``replay_interval_steps x hidden layers``. Unset (the
    #: default): chosen by ``overhead_budget``; set, it wins (BUDGET-8).
    replay_interval_steps: int | None = attrs.field(default=None, validator=_optional_count(
        "replay_interval_steps", 1, 1_000_000, "chosen by overhead_budget"))
    #: Replay only the first rows of each captured batch (CAP-8): a replay then costs about
    #: ``replay_rows / batch`` of the live call. 0 replays the whole batch.
    replay_rows: int = attrs.field(default=1, validator=_count("replay_rows", 0, 1_000_000))
    #: The live path's self-check (spec/replay.md SELF-1..SELF-9): each captured module call is
    #: also replayed on its own rank -- outside the live forward and backward, at the optimizer's
    #: pre-step hook -- and compared with its live output, bit for bit: a transient fault of the
    #: live computation, which no later vote sees, is named. No collective; about
    #: ``replay_rows / batch`` of one module's forward per capture.
    self_check: bool = attrs.field(default=True, validator=_flag("self_check"))
    #: Steps between two checks of loop stragglers (LOOP-3): each compares the ranks' time in
    #: the training loop outside collectives over the ``loop_check_steps`` steps before it (LOOP-8:
    #: where the overhead budget spaces the checks further apart, the steps between are not timed).
    loop_check_steps: int = attrs.field(default=10, validator=_count("loop_check_steps", 1, 1_000_000))
    #: The least wall time between two loop checks the overhead budget aims at (spec/budget.md
    #: BUDGET-11): on a job whose steps are shorter than ``loop_check_interval_s /
    #: loop_check_steps`` each of its decisions lengthens the interval to about this many seconds
    #: (a check's cost is per check, its value per second); 0 keeps ``loop_check_steps``. 5 s, not
    #: 1 s: on a job of short steps, checks every second alone take nearly the 1 % budget
    #: (BUDGET-11's measurement); a loop straggler is then confirmed in ~20-25 s instead of ~5 s.
    loop_check_interval_s: float = attrs.field(default=5.0, validator=_seconds_or_zero("loop_check_interval_s", 3600.0))
    #: Steps between two of the agreements that switch a failed part of scout off on every rank
    #: (spec/guard.md GUARD-4): one all-reduce on scout's control group per this many steps. A
    #: part that failed is stopped on its own rank at once; the others stop it at the next one.
    agreement_interval_steps: int = attrs.field(default=10,
                                                validator=_count("agreement_interval_steps", 1, 1_000_000))
    #: The least wall time between two agreements the overhead budget aims at (spec/budget.md
    #: BUDGET-13): on a job whose steps are shorter than ``agreement_interval_s /
    #: agreement_interval_steps`` each of its decisions lengthens the interval to about this many
    #: seconds (an agreement's cost is per agreement; a failed part is already stopped on its own
    #: rank, the others stop it that much later); 0 keeps ``agreement_interval_steps``.
    agreement_interval_s: float = attrs.field(default=5.0, validator=_seconds_or_zero("agreement_interval_s", 3600.0))
    #: Timed repetitions of each replay for straggler timing (STRAG-1), after the run that gives
    #: the SDC evidence; 0 times that run itself. Each repetition costs one more replay.
    straggler_repetitions: int = attrs.field(default=0, validator=_count("straggler_repetitions", 0, 16))
    #: A checkpoint (DCP) at every this many cycle boundaries; it is verified one cycle later.
    checkpoint_every_cycles: int = attrs.field(default=5, validator=_count("checkpoint_every_cycles", 1, 1_000_000))
    #: What an attributed SDC does: ``report`` writes the report; ``restart`` also stops every
    #: rank at the same step (``scout.FaultDetected``) so the launcher restarts the job.
    on_sdc: str = attrs.field(default="report", validator=_choice("on_sdc", POLICIES))
    #: What a hang does: ``report``; ``restart`` also ends the trainer so the launcher restarts.
    on_hang: str = attrs.field(default="report", validator=_choice("on_hang", POLICIES))
    #: What a failed checkpoint save does (spec/gate.md GATE-40): ``stop`` raises
    #: ``CheckpointSaveFailed`` on every rank; ``continue`` trains on without that checkpoint.
    on_checkpoint_error: str = attrs.field(default="stop",
                                           validator=_choice("on_checkpoint_error", CHECKPOINT_ERROR_POLICIES))
    #: What restore() does when the checkpoint it chose has no files (spec/recovery.md
    #: RECOVERY-7): ``fallback`` marks it LOST (GATE-42) and decides again -- an older verified
    #: checkpoint, the latest, or a fresh start; ``stop`` raises FileNotFoundError on every rank.
    on_missing_checkpoint: str = attrs.field(default="fallback",
                                             validator=_choice("on_missing_checkpoint", MISSING_CHECKPOINT_POLICIES))
    #: Switch the parts on or off.
    observer: bool = attrs.field(default=True, validator=_flag("observer"))
    replay: bool = attrs.field(default=True, validator=_flag("replay"))
    #: The job's id (namespaces progress records and observer groups); by default the
    #: launcher's (TORCHELASTIC_RUN_ID, SLURM_JOB_ID), stable across restarts.
    job_id: str | None = attrs.field(default=None, validator=_optional_text("job_id"))
    #: The address observers bind to; by default loopback on one host, else the address of the
    #: interface that reaches MASTER_ADDR.
    observer_host: str | None = attrs.field(default=None, validator=_optional_text("observer_host"))
    #: A directory every rank sees, for the observers' rendezvous instead of the launcher's store.
    rendezvous_dir: str | None = attrs.field(default=None, validator=_optional_text("rendezvous_dir"))
    #: Bound on every scout collective (replay exchanges, the start-up rendezvous).
    collective_timeout_s: float = attrs.field(default=120.0, validator=_positive_s("collective_timeout_s", 3600.0))
    #: After on_hang=restart asks a trainer to end (SIGTERM), SIGKILL follows this much later.
    kill_grace_s: float = attrs.field(default=5.0, validator=_positive_s("kill_grace_s", 600.0))
    #: Bytes a replay capture may hold (inputs of the recipes due at a step).
    max_capture_bytes: int = attrs.field(default=256 * 2**20, validator=_count("max_capture_bytes", 0, 2**40))
    #: An MoE regime catalog (`scout moe-catalog`, spec/moe.md): expert recipes at its compressed
    #: keys, sharing the dense recipes' cycle (MOE-10), voted among the replicas of each expert.
    moe_catalog: str | None = attrs.field(default=None, validator=_optional_text("moe_catalog"))
    #: The grouped-experts modules, comma-separated names as ``model.named_modules()`` gives them
    #: (spec/moe.md MOE-9); unset: modules named GroupedExperts (or subclasses), else by structure.
    moe_experts: str | None = attrs.field(default=None, validator=_module_names("moe_experts"))
    #: Expert recipes replayed at most per step when a catalog has more recipes than the dense
    #: cycle has steps (spec/moe.md MOE-10); a larger value keeps the cycle nearer the dense one.
    max_expert_replays_per_step: int = attrs.field(default=8, validator=_count("max_expert_replays_per_step", 1, 4096))
    #: The golden canary (spec/canary.md): recorded at the first cycle end, re-checked at every
    #: cycle end on every rank; a change -- on one rank or on all (common mode) -- is SDC.
    canary: bool = attrs.field(default=False, validator=_flag("canary"))
    #: Prometheus metrics of this node (docs/metrics.md), served by scout's per-node sidecar
    #: process, not by a trainer (a frozen trainer does not freeze them); unset: off. 0 picks
    #: a free port (written to ``run_dir/ops/node-<host>-r<rank>.json``).
    metrics_port: int | None = attrs.field(default=None, validator=_optional_port("metrics_port"))
    #: The address the metrics endpoint binds: loopback by default; ``0.0.0.0`` (or the node's
    #: address) for a Prometheus server on another host.
    metrics_addr: str = attrs.field(default="127.0.0.1", validator=_optional_text("metrics_addr"))
    #: A command run by the sidecar for each new report, the record as JSON on stdin
    #: (spec/ops.md OPS-4); e.g. ``python examples/alert_webhook.py``. Unset: off.
    on_report: str | None = attrs.field(default=None, validator=_optional_command("on_report"))
    #: An ``on_report`` command still running this long after it started is killed (and logged).
    on_report_timeout_s: float = attrs.field(default=10.0, validator=_positive_s("on_report_timeout_s", 600.0))

    def expert_names(self) -> tuple[str, ...]:
        """``moe_experts`` as a tuple of module names (empty when unset, MOE-9)."""
        return () if self.moe_experts is None else tuple(n.strip() for n in self.moe_experts.split(","))

    def __attrs_post_init__(self) -> None:
        if self.round_deadline_s > self.recheck_interval_s:
            raise ConfigError(
                f"round_deadline_s ({self.round_deadline_s}) must not exceed recheck_interval_s "
                f"({self.recheck_interval_s}): a round must end before the next one starts"
            )
        if self.round_deadline_s >= self.stall_threshold_s:
            raise ConfigError(
                f"round_deadline_s ({self.round_deadline_s}) must be shorter than stall_threshold_s "
                f"({self.stall_threshold_s})"
            )

    def observer_fields(self) -> dict[str, Any]:
        """The ObserverConfig fields these settings give."""
        return {
            "stall_threshold_s": self.stall_threshold_s,
            "data_stall_threshold_s": self.data_stall_threshold_s,
            "checkpoint_stall_threshold_s": self.checkpoint_stall_threshold_s,
            "round_deadline_s": self.round_deadline_s,
            "recheck_interval_s": self.recheck_interval_s,
            "join_deadline_s": self.collective_timeout_s,
            "attach_deadline_s": self.collective_timeout_s,
        }


_FIELDS: Final = {field.name: field for field in attrs.fields(Config)}
#: Keys whose default is None but whose values are ints (read from the environment as ints).
_OPTIONAL_INTS: Final = frozenset({"metrics_port", "replay_interval_steps"})


def _from_text(key: str, text: str, source: str) -> Any:
    """An environment value, read as the type of ``key``'s default."""
    field = _FIELDS[key]
    default = field.default
    try:
        if key in _OPTIONAL_INTS:
            return int(text)
        if isinstance(default, bool):
            lowered = text.strip().lower()
            if lowered not in ("1", "0", "true", "false", "yes", "no"):
                raise ValueError(text)
            return lowered in ("1", "true", "yes")
        if isinstance(default, int):
            return int(text)
        if isinstance(default, float):
            return float(text)
    except ValueError:
        expected = "int" if key in _OPTIONAL_INTS else type(default).__name__
        raise ConfigError(f"{source}: {text!r} is not a valid {expected} for {key}") from None
    return text


def _check_keys(values: Mapping[str, Any], source: str) -> None:
    unknown = sorted(set(values) - set(_FIELDS))
    if unknown:
        hints = [f"{key!r} (did you mean {close[0]!r}?)" if (close := difflib.get_close_matches(
            key, _FIELDS, n=1, cutoff=_MISSPELLING_RATIO)) else repr(key) for key in unknown]
        raise ConfigError(f"{source}: unknown key(s) {', '.join(hints)}; the keys are {sorted(_FIELDS)}")


def _line_of(text: str, key: str) -> int | None:
    """The line of ``key = ...`` in a TOML text (the first one), for error messages."""
    pattern = re.compile(rf'^[ \t]*["\']?{re.escape(key)}["\']?[ \t]*=', re.MULTILINE)
    match = pattern.search(text)
    return None if match is None else text.count("\n", 0, match.start()) + 1


def _read_file(path: Path) -> tuple[dict[str, Any], dict[str, str]]:
    """The file's settings and, per key, where it came from (``file:line``)."""
    try:
        if not path.is_file():
            raise ConfigError(f"config file {path} does not exist or is not a regular file")
        if path.stat().st_size > CONFIG_BYTES_MAX:
            raise ConfigError(f"config file {path} is over {CONFIG_BYTES_MAX} bytes")
        text = path.read_text(encoding="utf-8")
        data = tomllib.loads(text)
    except PermissionError as error:
        raise ConfigError(f"config file {path} cannot be read: {error.strerror}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as error:
        raise ConfigError(f"config file {path} is not valid TOML: {error}") from None
    if "scout" in data:
        others = sorted(key for key in data if key != "scout")
        if others:
            raise ConfigError(f"config file {path} has a [scout] table and top-level keys {others}: put every "
                              "setting under [scout], or every setting at the top level, not both")
        table = data["scout"]
        if not isinstance(table, dict):
            raise ConfigError(f"config file {path}: scout must be a [scout] table, got {type(table).__name__}")
    else:
        table = data
    _check_keys(table, f"config file {path}")
    sources = {}
    for key in table:
        line = _line_of(text, key)
        sources[key] = f"config file {path}" + ("" if line is None else f":{line}")
    return dict(table), sources


def _setting_variables() -> dict[str, str]:
    return {ENV_PREFIX + key.upper(): key for key in _FIELDS}


def _other_variable(name: str) -> bool:
    return any(name == other or (other.endswith("_") and name.startswith(other)) for other in OTHER_VARIABLES)


def unknown_variables(environ: Mapping[str, str] | None = None) -> list[str]:
    """``SCOUT_*`` variables that are neither settings nor scout's other variables and do not
    look like a setting either (those are errors in :func:`load_config`): ignored, and worth a
    warning."""
    env = os.environ if environ is None else environ
    settings = _setting_variables()
    return sorted(name for name in env if name.startswith(ENV_PREFIX) and name not in settings
                  and not _other_variable(name))


def _check_variables(env: Mapping[str, str]) -> None:
    """A ``SCOUT_*`` variable one typo away from a setting is an error naming the setting."""
    settings = _setting_variables()
    for name in unknown_variables(env):
        close = difflib.get_close_matches(name, settings, n=1, cutoff=_MISSPELLING_RATIO)
        if close:
            raise ConfigError(f"environment variable {name} is not a scout setting; did you mean {close[0]}? "
                              f"(unset it or rename it; the settings are in docs/attach.md)")


def _validate(values: Mapping[str, Any], sources: Mapping[str, str]) -> Config:
    """``Config(**values)``, every error prefixed by where the offending value came from."""
    for key, value in values.items():
        validator = _FIELDS[key].validator
        if validator is None:
            continue
        try:
            validator(None, _FIELDS[key], value)
        except ConfigError as error:
            raise ConfigError(f"{sources[key]}: {error}") from None
    try:
        return Config(**values)
    except ConfigError as error:
        # A rule between two keys (round_deadline_s < stall_threshold_s): name both sources.
        involved = [key for key in sorted(_FIELDS) if re.search(rf"\b{key}\b", str(error))]
        origin = "; ".join(f"{key} from {sources.get(key, 'the default')}" for key in involved)
        raise ConfigError(f"{error} ({origin})" if origin else str(error)) from None


def load_config(
    config: str | os.PathLike[str] | Config | Mapping[str, Any] | None = None,
    overrides: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
) -> Config:
    """Defaults < file (or a Config / mapping) < ``SCOUT_*`` environment < ``overrides``."""
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    if isinstance(config, Config):
        values.update(attrs.asdict(config))
        sources.update(dict.fromkeys(values, "the Config passed as config"))
    elif isinstance(config, Mapping):
        _check_keys(config, "config mapping")
        values.update(config)
        sources.update({key: f"config mapping key {key}" for key in config})
    elif config is not None:
        from_file, file_sources = _read_file(Path(config))
        values.update(from_file)
        sources.update(file_sources)
    env = os.environ if environ is None else environ
    _check_variables(env)
    for name, key in _setting_variables().items():
        if name in env:
            source = f"environment variable {name}"
            values[key] = _from_text(key, env[name], source)
            sources[key] = source
    if overrides:
        _check_keys(overrides, "scout.attach keyword arguments")
        values.update(overrides)
        sources.update({key: f"scout.attach keyword {key}" for key in overrides})
    return _validate(values, sources)
