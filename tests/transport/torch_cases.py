"""torch-specific cases (run by torch_worker.py and tests/gpu/gpu_worker.py; checked by
test_conformance_torch.py and tests/gpu).

torch is imported inside the run functions only, so that pytest can import the checks without
paying for ``import torch`` in its own process. ``hooks.device`` says where tensors live
("cpu" with gloo, "cuda:<local rank>" with NCCL).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from scout.transport import codec
from scout.transport._binding import Op, Stream, group_key, pack_frame
from scout.transport.base import DeadlineExceeded, Group, TransportError
from tests.transport import binding_cases as cases

if TYPE_CHECKING:
    from scout.transport.nccl import TorchTransport

LONG_TIMEOUT_S = cases.LONG_TIMEOUT_S
SHORT_TIMEOUT_S = cases.SHORT_TIMEOUT_S


class TorchHooks:
    binding = "torch"

    def __init__(self, store: Any, file_store_path: str, device: str = "cpu") -> None:
        self.store = store
        self.file_store_path = file_store_path
        self.device = device
        self._injected: list[tuple[Any, str]] = []

    def inject(self, transport: TorchTransport, group: Group, round_id: int, kind: str) -> None:
        # A bad value under this rank's own key for that round: what a peer would read.
        from torch.distributed import PrefixStore  # type: ignore[attr-defined]

        if kind == "garbage":
            data = b"\x00not a frame\xff" * 3
        else:
            data = pack_frame(
                Stream.EXCHANGE,
                Op.EXCHANGE,
                group_key(group),
                round_id - 1,
                transport.rank,
                codec.encode("stale"),
            )
        key = f"{int(Stream.EXCHANGE)}/{group_key(group):x}/{round_id}/{transport.rank}"
        raw = PrefixStore(f"scout/{transport.namespace}", self.store)
        raw.set(key, data)
        self._injected.append((raw, key))

    def cleanup_injected(self, transport: TorchTransport) -> None:
        while self._injected:
            raw, key = self._injected.pop()
            raw.delete_key(key)

    def fresh_transport(self) -> TorchTransport:
        from scout.transport.nccl import TorchTransport

        return TorchTransport(store=self.store)


def run_tensors(t: TorchTransport, hooks: Any) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    mine = torch.full((3,), float(t.rank), device=hooks.device)
    gathered = t.all_gather_tensor(mine, timeout_s=LONG_TIMEOUT_S)
    out = [torch.empty(3, device=hooks.device) for _ in range(t.size)]
    returned = t.all_gather_tensor(mine, timeout_s=LONG_TIMEOUT_S, out=out)
    root = t.size - 1
    value = torch.full((2,), float(t.rank * 10), device=hooks.device)
    t.broadcast_tensor(value, root=root, timeout_s=LONG_TIMEOUT_S)
    # A registered subgroup: torch wants every rank to create every group, in the same order.
    members_by_parity = {p: [r for r in range(t.size) if r % 2 == p] for p in (0, 1)}
    parities = {p: dist.new_group(m) for p, m in members_by_parity.items() if m}
    parity = t.group([r for r in range(t.size) if r % 2 == t.rank % 2], "parity")
    unregistered = cases._error_name(
        lambda: t.all_gather_tensor(mine, timeout_s=LONG_TIMEOUT_S, group=parity)
    )
    t.register_process_group(parity, parities[t.rank % 2])
    sub_gathered = t.all_gather_tensor(mine, timeout_s=LONG_TIMEOUT_S, group=parity)
    sub_value = torch.full((1,), float(t.rank), device=hooks.device)
    t.broadcast_tensor(sub_value, root=parity.ranks[0], timeout_s=LONG_TIMEOUT_S, group=parity)
    reversed_parity = t.group(list(reversed(parity.ranks)), "parity-reversed")
    mismatched = (
        cases._error_name(lambda: t.register_process_group(reversed_parity, parities[t.rank % 2]))
        if len(parity.ranks) > 1
        else "GroupError"
    )
    return {
        "gathered": [x.tolist() for x in gathered],
        "out_filled": returned is out
        and [x.tolist() for x in out] == [x.tolist() for x in gathered],
        "broadcast": value.tolist(),
        "unregistered": unregistered,
        "sub_gathered": [x.tolist()[0] for x in sub_gathered],
        "sub_broadcast": sub_value.tolist(),
        "mismatched_order": mismatched,
        "not_a_tensor": cases._error_name(lambda: t.all_gather_tensor([1], timeout_s=1)),
        "bad_timeout": cases._error_name(lambda: t.broadcast_tensor(mine, root=0, timeout_s=-1)),
        "root_outside": cases._error_name(
            lambda: t.broadcast_tensor(mine, root=t.size, timeout_s=1)
        ),
    }


def check_tensors(results: list[dict[str, Any]], size: int, binding: str) -> None:
    cases._no_errors(results)
    for rank, r in enumerate(results):
        members = [p for p in range(size) if p % 2 == rank % 2]
        assert r["gathered"] == [[float(p)] * 3 for p in range(size)]
        assert r["out_filled"]
        assert r["broadcast"] == [float((size - 1) * 10)] * 2
        assert r["unregistered"] == "GroupError"
        assert r["sub_gathered"] == [float(p) for p in members]
        assert r["sub_broadcast"] == [float(members[0])]
        assert r["mismatched_order"] == "GroupError"
        assert r["not_a_tensor"] == "TypeError"
        assert r["bad_timeout"] == "ValueError"
        assert r["root_outside"] == "GroupError"


def run_tensor_silent_peer(t: TorchTransport, hooks: Any) -> dict[str, Any]:
    """A tensor deadline names the absent rank (store notices); the group's tensor path then
    refuses to run while the collective is in flight, the exchange keeps working, and once the
    late peer completed it the group's tensors run again (spec/transport.md WAIT-2, WAIT-3)."""
    import torch
    import torch.distributed as dist

    pg = dist.new_group(list(range(t.size)))
    group = t.group(list(range(t.size)), "tensor-deadline")
    t.register_process_group(group, pg)
    silent = t.size - 1
    mine = torch.full((2,), float(t.rank), device=hooks.device)
    out: dict[str, Any] = {}
    if t.rank == silent:
        time.sleep(cases.SILENT_SLEEP_S)
        late = t.all_gather_tensor(mine, timeout_s=LONG_TIMEOUT_S, group=group)
        out["late"] = [x.tolist()[0] for x in late]
    else:
        start_s = time.monotonic()
        try:
            t.all_gather_tensor(mine, timeout_s=SHORT_TIMEOUT_S, group=group)
        except DeadlineExceeded as exc:
            out["missing"] = list(exc.missing)
        out["elapsed_s"] = time.monotonic() - start_s
        out["after"] = cases._error_name(
            lambda: t.all_gather_tensor(mine, timeout_s=1, group=group)
        )
    out["exchange_missing"] = list(t.exchange(1, round_id=1300, timeout_s=LONG_TIMEOUT_S).missing)
    # WAIT-3: the late peer entered #0, so it completes everywhere; the group is usable again.
    # "Completes" is asynchronous on the ranks that gave up on it, so they look again (bounded).
    retry_until_s = time.monotonic() + LONG_TIMEOUT_S
    refusals = 0
    while True:
        try:
            again = t.all_gather_tensor(mine, timeout_s=LONG_TIMEOUT_S, group=group)
        except TransportError:
            refusals += 1
            if time.monotonic() >= retry_until_s:
                raise
            time.sleep(0.01)
            continue
        out["again"] = [x.tolist()[0] for x in again]
        break
    out["refusals_before_recovery"] = refusals
    return out


def check_tensor_silent_peer(results: list[dict[str, Any]], size: int, binding: str) -> None:
    cases._no_errors(results)
    silent = size - 1
    for rank, r in enumerate(results):
        if rank == silent:
            assert r["late"] == [float(p) for p in range(size)]
        else:
            assert r["missing"] == [silent]
            cases._assert_deadline_kept(r["elapsed_s"], SHORT_TIMEOUT_S, "all_gather_tensor")
            assert r["after"] == "TransportError"
        assert r["exchange_missing"] == []
        assert r["again"] == [float(p) for p in range(size)]


def run_any_store(t: TorchTransport, hooks: Any) -> dict[str, Any]:
    """The evidence path works over any Store: here a FileStore shared by the ranks."""
    from torch.distributed import FileStore  # type: ignore[attr-defined]

    from scout.transport.nccl import TorchTransport

    other = TorchTransport(store=FileStore(hooks.file_store_path, t.size), namespace="filestore")
    try:
        result = other.exchange(t.rank, round_id=1, timeout_s=LONG_TIMEOUT_S)
        gathered = other.all_gather(t.rank * 3, timeout_s=LONG_TIMEOUT_S)
        return {"answers": result.by_position(None), "gathered": gathered}
    finally:
        other.close()


def check_any_store(results: list[dict[str, Any]], size: int, binding: str) -> None:
    cases._no_errors(results)
    for r in results:
        assert r["answers"] == list(range(size))
        assert r["gathered"] == [3 * p for p in range(size)]


def run_store_bounded(t: TorchTransport, hooks: Any) -> dict[str, Any]:
    """Each rank deletes its own keys once they are keep_rounds old: the store stays bounded."""
    from scout.transport.nccl import TorchTransport

    keep_rounds = 4
    bounded = TorchTransport(store=hooks.store, keep_rounds=keep_rounds)
    prefix = f"scout/{bounded.namespace}/"
    try:
        for round_id in range(1, 21):
            bounded.exchange(round_id, round_id=round_id, timeout_s=LONG_TIMEOUT_S)
            bounded.all_gather(round_id, timeout_s=LONG_TIMEOUT_S)
        bounded.barrier(timeout_s=LONG_TIMEOUT_S)
        keys = [k for k in hooks.store.list_keys() if k.lstrip("/").startswith(prefix)]
        bounded.barrier(timeout_s=LONG_TIMEOUT_S)
    finally:
        bounded.close()
    return {"keys": len(keys), "keep_rounds": keep_rounds}


def check_store_bounded(results: list[dict[str, Any]], size: int, binding: str) -> None:
    cases._no_errors(results)
    for r in results:
        # Per rank at most keep_rounds exchange keys and keep_rounds collective keys (+1 for
        # a barrier posted before another rank's cleanup of its previous one).
        assert r["keys"] <= size * (2 * r["keep_rounds"] + 1), r


TORCH_CASES: dict[str, cases.Case] = {
    case.name: case
    for case in (
        cases.Case("torch_tensors", run_tensors, check_tensors),
        cases.Case("torch_tensor_silent_peer", run_tensor_silent_peer, check_tensor_silent_peer, 2),
        cases.Case("torch_any_store", run_any_store, check_any_store),
        cases.Case("torch_store_bounded", run_store_bounded, check_store_bounded),
    )
}
