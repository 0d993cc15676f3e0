"""The golden canary, torch side (spec/canary.md CANARY-1..CANARY-8).

A vote names a minority; corruption that every replica shares -- a miscompiled or mis-selected
kernel after a library or driver change, a faulty functional unit design shared by every chip
of a kind -- agrees with itself everywhere and no vote sees it. The canary compares each rank
with the past instead: per recipe class a small fixed computation (fixed inputs, fixed weights
from a fixed seed, deterministic kernels, on the job's device and dtype; CANARY-2) whose
signatures are recorded at the first check (voted across the job, CANARY-3) and re-checked at
every cycle end on every rank (CANARY-4). The decision is pure
(:func:`scout.core.canary.decide_canary`); :meth:`CanaryMonitor.gate_results` turns it into
one RecipeResult per peer group for the gate's ``canary`` recipe (CANARY-7), through the one
conversion ``scout.gate.results.recipe_verdicts`` like every replay.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from scout.core.canary import CanaryDecision, CanaryOutcome, decide_canary
from scout.core.recipes import RecipeClass, RecipeId, RecipeResult
from scout.core.verdict import MISSING, Status
from scout.replay.replay import deterministic_algorithms
from scout.replay.signature import structured_signature

__all__ = ["CANARY_RECIPE", "Canary", "CanaryMonitor"]

CANARY_RECIPE = RecipeId(RecipeClass.CANARY)
_WIDTH = 64
_ROWS = 16
_VOCAB = 128


def _fixed(shape: tuple[int, ...], seed: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    values: torch.Tensor = torch.randn(shape, generator=generator) / shape[-1] ** 0.5
    return values.to(device=device, dtype=dtype)


class Canary:
    """CANARY-2: the fixed computation of each recipe class, on ``device`` in ``dtype``."""

    CLASSES = (RecipeClass.EMBEDDING, RecipeClass.HIDDEN, RecipeClass.OUTPUT, RecipeClass.OPTIMIZER,
               RecipeClass.EXPERT)

    def __init__(self, classes: Sequence[RecipeClass] = CLASSES, *, device: torch.device | str = "cpu",
                 dtype: torch.dtype = torch.float32, seed: int = 2608) -> None:
        unknown = [c for c in classes if c not in self.CLASSES]
        if unknown or not classes:
            raise ValueError(f"canary classes must be a non-empty subset of {[c.value for c in self.CLASSES]}, "
                             f"got {[getattr(c, 'value', c) for c in classes]}")
        self.classes = tuple(classes)
        self.device = torch.device(device)
        self.dtype = dtype
        self.seed = seed

    def _t(self, shape: tuple[int, ...], salt: int) -> torch.Tensor:
        return _fixed(shape, self.seed + salt, self.device, self.dtype)

    def _signed_backward(self, output: torch.Tensor, inputs: list[torch.Tensor]) -> Any:
        cotangent = self._t(tuple(output.shape), 99)
        gradients = torch.autograd.grad([output], inputs, [cotangent], allow_unused=True)
        return [output.detach(), *gradients]

    def run(self, recipe_class: RecipeClass) -> Any:
        """The values a class's canary produces (forward and backward)."""
        w = self._t((_WIDTH, _WIDTH), 1).requires_grad_(True)
        x = self._t((_ROWS, _WIDTH), 2).requires_grad_(True)
        if recipe_class is RecipeClass.EMBEDDING:
            table = self._t((_VOCAB, _WIDTH), 3).requires_grad_(True)
            ids = torch.arange(_ROWS, device=self.device) * 7 % _VOCAB
            return self._signed_backward(F.embedding(ids, table), [table])
        if recipe_class is RecipeClass.HIDDEN:
            q, k, v = (self._t((_ROWS, _WIDTH), s) for s in (4, 5, 6))
            h = F.layer_norm(x, (_WIDTH,))
            attention = (q @ k.t() / _WIDTH**0.5).softmax(-1) @ v
            out = F.gelu(h @ w) + attention
            return self._signed_backward(out, [x, w])
        if recipe_class is RecipeClass.OUTPUT:
            head = self._t((_VOCAB, _WIDTH), 7).requires_grad_(True)
            targets = torch.arange(_ROWS, device=self.device) * 5 % _VOCAB
            loss = F.cross_entropy((x @ head.t()).float(), targets).to(self.dtype)
            return self._signed_backward(loss.reshape(1), [x, head])
        if recipe_class is RecipeClass.OPTIMIZER:
            parameter = torch.nn.Parameter(self._t((_WIDTH, _WIDTH), 8).clone())
            parameter.grad = self._t((_WIDTH, _WIDTH), 9)
            optimizer = torch.optim.AdamW([parameter], lr=1e-3, foreach=False)
            optimizer.step()
            state = optimizer.state[parameter]
            return [parameter.detach(), state["exp_avg"], state["exp_avg_sq"]]
        # EXPERT: the grouped expert GEMM at a few-row and a many-row count (both GEMM paths).
        experts = self._t((4, _WIDTH, _WIDTH), 10).requires_grad_(True)
        rows = [x[:2] @ experts[0], x @ experts[1], torch.bmm(x[:3].unsqueeze(1),
                                                              experts[2].unsqueeze(0).expand(3, -1, -1)).squeeze(1)]
        out = torch.cat(rows)
        return self._signed_backward(out, [x, experts])

    def signatures(self) -> dict[str, int]:
        """CANARY-2: each class's canary signature (SIG-10 over its forward and backward)."""
        with deterministic_algorithms(True), torch.enable_grad():
            return {c.value: structured_signature(self.run(c)) for c in self.classes}


class CanaryMonitor:
    """One rank's side of the job-wide canary check (CANARY-3..CANARY-8).

    ``exchange(value) -> list``: every rank's value, by rank (``all_gather_object`` on a group
    spanning the job, e.g. ``scout.attach``'s control group). ``golden_path``: where the golden
    signatures live (rank 0 writes it; it survives restarts, CANARY-8). ``rank``: this rank.
    """

    def __init__(self, canary: Canary, exchange: Callable[[Any], list[Any]], *, rank: int,
                 golden_path: str | os.PathLike[str] | None = None) -> None:
        self.canary = canary
        self.exchange = exchange
        self.rank = rank
        self.golden_path = None if golden_path is None else Path(golden_path)
        mine = self._read_golden() if rank == 0 else None
        self.golden: dict[str, int] | None = exchange(mine)[0]
        self.last: CanaryDecision | None = None

    def _read_golden(self) -> dict[str, int] | None:
        if self.golden_path is None or not self.golden_path.exists():
            return None
        try:
            data = json.loads(self.golden_path.read_text(encoding="utf-8"))
            environment, signatures = data["environment"], data["signatures"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"the canary golden {self.golden_path} cannot be read ({exc!r}): move it away to "
                             "record a new one") from exc
        if environment != self._environment():
            raise ValueError(f"the canary golden {self.golden_path} was recorded in {environment}, this job runs in "
                             f"{self._environment()}: move it away to record a new one")
        return {str(k): int(v) for k, v in signatures.items()}

    def _write_golden(self, step: int) -> None:
        """CANARY-8: durably (file fsync, rename, directory fsync), so a restart after a crash
        finds the golden of the first check, not a half-written one."""
        assert self.golden_path is not None
        scratch = self.golden_path.with_suffix(".tmp")
        body = json.dumps({"schema": "scout.canary/1", "step": step, "environment": self._environment(),
                           "signatures": self.golden}, indent=2, sort_keys=True)
        with open(scratch, "w", encoding="utf-8") as out:
            out.write(body)
            out.flush()
            os.fsync(out.fileno())
        os.replace(scratch, self.golden_path)
        directory = os.open(self.golden_path.parent, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)

    def _environment(self) -> dict[str, str]:
        device = self.canary.device
        name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
        return {"torch": torch.__version__, "device": f"{device.type}:{name}", "dtype": str(self.canary.dtype)}

    def check(self, step: int) -> CanaryDecision:
        """Collective: run the canary, exchange, decide (the same on every rank)."""
        try:
            mine: Any = self.canary.signatures()
        except Exception as exc:  # a canary that cannot run is no evidence: Inconclusive
            mine = {"error": repr(exc)}
        readings = self.exchange(mine)
        usable = [MISSING if "error" in r else r for r in readings]
        decision = decide_canary(self.golden, usable)
        if decision.outcome is CanaryOutcome.RECORDED:
            self.golden = dict(decision.golden)
            if self.rank == 0 and self.golden_path is not None:
                self.golden_path.parent.mkdir(parents=True, exist_ok=True)
                self._write_golden(step)
        self.last = decision
        return decision

    @staticmethod
    def gate_results(decision: CanaryDecision, step: int, partition: Sequence[Sequence[int]]) -> list[RecipeResult]:
        """CANARY-7: one result per peer group for the gate's ``canary`` recipe: ATTRIBUTED with
        the positions of the changed ranks in the group, AGREE, or INCONCLUSIVE."""
        results = []
        for members in partition:
            if decision.status is Status.INCONCLUSIVE:
                results.append(RecipeResult(CANARY_RECIPE, step, Status.INCONCLUSIVE, reason=decision.reason or
                                            "canary-inconclusive"))
                continue
            outliers = tuple(i for i, rank in enumerate(members) if rank in decision.ranks)
            if outliers:
                results.append(RecipeResult(CANARY_RECIPE, step, Status.ATTRIBUTED, outliers,
                                            (f"canary:{decision.outcome.value}",) + decision.classes))
            else:
                results.append(RecipeResult(CANARY_RECIPE, step, Status.AGREE))
        return results
