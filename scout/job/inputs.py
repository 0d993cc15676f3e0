"""What ``scout.attach`` takes as the model, the optimizer and the other training state, checked
before anything starts (spec/frameworks.md FRAME-1, FRAME-3).

Frameworks hand out wrappers: Accelerate's ``AcceleratedOptimizer`` and ``AcceleratedScheduler``
(Hugging Face's Trainer too), Lightning's ``LightningOptimizer``, DeepSpeed's engine. A wrapper
that subclasses ``torch.optim.Optimizer`` without running its ``__init__`` passes an
``isinstance`` check and then fails deep inside scout (no hook tables). So the wrappers scout
knows are unwrapped here, by the attribute that holds the wrapped object, and anything else that
is not what scout needs is a :class:`~scout.job.config.ConfigError` naming its type and what to
pass instead -- raised before a process, a record or a hook exists.
"""

from __future__ import annotations

import keyword
from collections.abc import Mapping
from typing import Any, Final

from scout.job.config import ConfigError

__all__ = ["KNOWN_WRAPPERS", "checked_state", "unwrap_model", "unwrap_optimizer", "unwrap_stateful"]

#: FRAME-1: (module prefix, class name) -> the attribute that holds the wrapped object.
KNOWN_WRAPPERS: Final[dict[tuple[str, str], str]] = {
    ("accelerate", "AcceleratedOptimizer"): "optimizer",
    ("accelerate", "AcceleratedScheduler"): "scheduler",
    ("lightning", "LightningOptimizer"): "_optimizer",
    ("pytorch_lightning", "LightningOptimizer"): "_optimizer",
    ("deepspeed", "DeepSpeedEngine"): "module",
    ("megatron", "MegatronOptimizer"): "optimizer",
}
#: Wrappers inside wrappers are unwrapped this many times at most (a cycle is a bug of the wrapper).
UNWRAP_DEPTH_MAX: Final = 8
#: The attributes torch.optim.Optimizer.__init__ creates; an object without them was not built by it.
_OPTIMIZER_TABLES: Final = ("param_groups", "state", "_optimizer_step_pre_hooks", "_optimizer_step_post_hooks")


def _type_name(value: object) -> str:
    kind = type(value)
    return f"{kind.__module__}.{kind.__qualname__}"


def _wrapped_attribute(value: object) -> str | None:
    kind = type(value)
    for klass in kind.__mro__:
        root = klass.__module__.split(".", 1)[0]
        attribute = KNOWN_WRAPPERS.get((root, klass.__name__))
        if attribute is not None:
            return attribute
    return None


def _unwrap(value: object, what: str) -> object:
    """Follow the known wrappers' attributes (FRAME-1)."""
    for _depth in range(UNWRAP_DEPTH_MAX):
        attribute = _wrapped_attribute(value)
        if attribute is None:
            return value
        inner = getattr(value, attribute, None)
        if inner is None:
            raise ConfigError(f"{what} is a {_type_name(value)} whose .{attribute} is None: pass the object it "
                              "wraps once the framework has built it (spec/frameworks.md FRAME-1)")
        value = inner
    raise ConfigError(f"{what}: more than {UNWRAP_DEPTH_MAX} wrappers inside each other ({_type_name(value)}); "
                      "pass the innermost object (spec/frameworks.md FRAME-1)")


def unwrap_optimizer(optimizer: object) -> Any:
    """FRAME-1: the ``torch.optim.Optimizer`` to attach to: ``optimizer`` itself, or the one a
    known wrapper holds; None stays None. Anything else is a ConfigError."""
    import torch

    if optimizer is None:
        return None
    inner = _unwrap(optimizer, "the optimizer")
    missing = [name for name in _OPTIMIZER_TABLES if not hasattr(inner, name)]
    if isinstance(inner, torch.optim.Optimizer) and not missing:
        return inner
    held = [name for name in ("optimizer", "_optimizer", "optim") if isinstance(getattr(inner, name, None),
                                                                               torch.optim.Optimizer)]
    hint = (f"it holds a torch optimizer at .{held[0]}: pass optimizer.{held[0]}" if held else
            "pass the torch.optim.Optimizer that it wraps")
    why = (f"it lacks {', '.join(missing)} (a subclass whose __init__ did not run torch.optim.Optimizer's)"
           if isinstance(inner, torch.optim.Optimizer) else "it is not a torch.optim.Optimizer")
    raise ConfigError(f"the optimizer is a {_type_name(inner)}, which scout cannot attach to: {why}; {hint} "
                      "(spec/frameworks.md FRAME-1)")


def unwrap_model(model: object) -> Any:
    """FRAME-1: the ``nn.Module`` to attach to: ``model`` or the module a known wrapper holds."""
    from torch import nn

    inner = _unwrap(model, "the model")
    if isinstance(inner, nn.Module):
        return inner
    held = [name for name in ("module", "model", "_orig_mod") if isinstance(getattr(inner, name, None), nn.Module)]
    hint = f"pass model.{held[0]}" if held else "pass the torch.nn.Module (plain, DDP or FSDP2) that trains"
    raise ConfigError(f"the model is a {_type_name(inner)}, not a torch.nn.Module; {hint} "
                      "(spec/frameworks.md FRAME-1)")


def unwrap_stateful(value: object, name: str) -> Any:
    """FRAME-3: one registered state object, unwrapped, with ``state_dict`` and ``load_state_dict``."""
    inner = _unwrap(value, f"state[{name!r}]")
    missing = [m for m in ("state_dict", "load_state_dict") if not callable(getattr(inner, m, None))]
    if missing:
        raise ConfigError(
            f"state[{name!r}] is a {_type_name(inner)}, which has no {' and no '.join(m + '()' for m in missing)}: scout saves "
            "each registered object's state_dict() and restores it with load_state_dict(); register an LR "
            "scheduler, a GradScaler, a stateful data loader or sampler, or any object with those two methods "
            "(torch.distributed.checkpoint.stateful.Stateful) (spec/frameworks.md FRAME-3)")
    return inner


def checked_state(state: Mapping[str, object] | None) -> dict[str, Any]:
    """FRAME-3: the ``state=`` keyword of ``attach``, checked and unwrapped."""
    if state is None:
        return {}
    if not isinstance(state, Mapping):
        raise ConfigError(f"state must be a mapping of names to objects with state_dict()/load_state_dict(), got "
                          f"{_type_name(state)}; e.g. state={{'lr': scheduler, 'data': sampler}} "
                          "(spec/frameworks.md FRAME-3)")
    checked: dict[str, Any] = {}
    for name, value in state.items():
        if not isinstance(name, str) or not name.isidentifier() or keyword.iskeyword(name):
            raise ConfigError(f"state name {name!r} must be a Python identifier (it names the entry in the "
                              "checkpoint), e.g. 'lr' or 'data' (spec/frameworks.md FRAME-3)")
        checked[name] = unwrap_stateful(value, name)
    return checked
