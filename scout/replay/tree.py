"""Minimal nested-value helpers for captured calls (tuples, lists, dicts of tensors and
plain values). Dict entries are visited in sorted-key order so that every peer enumerates
tensor leaves identically, whatever the insertion order of keyword arguments."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch

__all__ = ["describe", "map_tensors", "tensor_leaves"]

_PLAIN = (type(None), bool, int, float, str, bytes)


def _sorted_items(mapping: dict[Any, Any]) -> list[tuple[Any, Any]]:
    return sorted(mapping.items(), key=lambda item: repr(item[0]))


def tensor_leaves(value: Any) -> Iterator[torch.Tensor]:
    """Every tensor in ``value``, depth first, dict entries in sorted-key order."""
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (tuple, list)):
        for item in value:
            yield from tensor_leaves(item)
    elif isinstance(value, dict):
        for _, item in _sorted_items(value):
            yield from tensor_leaves(item)


def map_tensors(function: Callable[[torch.Tensor], Any], value: Any) -> Any:
    """A copy of ``value`` with every tensor replaced by ``function(tensor)``; other leaves
    are kept as they are. Named tuples keep their type."""
    if isinstance(value, torch.Tensor):
        return function(value)
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return type(value)(*(map_tensors(function, item) for item in value))
    if isinstance(value, (tuple, list)):
        return type(value)(map_tensors(function, item) for item in value)
    if isinstance(value, dict):
        return {key: map_tensors(function, item) for key, item in value.items()}
    return value


def describe(value: Any) -> Any:
    """A comparable description of a nested call: tensors by (dtype, shape, requires_grad,
    device type) -- not by content -- and plain leaves by value; anything else by type name."""
    if isinstance(value, torch.Tensor):
        return (
            "tensor",
            str(value.dtype),
            tuple(value.shape),
            value.requires_grad,
            value.device.type,
        )
    if isinstance(value, (tuple, list)):
        return (type(value).__name__, tuple(describe(item) for item in value))
    if isinstance(value, dict):
        return ("dict", tuple((repr(key), describe(item)) for key, item in _sorted_items(value)))
    if isinstance(value, _PLAIN):
        return ("value", value)
    return ("object", f"{type(value).__module__}.{type(value).__qualname__}")
