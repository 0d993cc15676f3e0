"""Instrumentation through public interfaces (spec/observer.md, "Instrumentation", INSTR-1..7).

In-process checks use a one-rank gloo group; the blocked-rank check runs four real gloo ranks
forked from a server that imported torch once."""

from __future__ import annotations

import inspect
import os
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

from scout.core.fingerprint import CollectiveCall, TensorMeta, fingerprint  # noqa: E402
from scout.observer import instrument as inst  # noqa: E402
from scout.observer.progress import ProgressPublisher, ProgressReader, RecordIdentity, Stage  # noqa: E402
from tests.observer import torch_ranks  # noqa: E402

pytestmark = pytest.mark.torchdist


@pytest.fixture
def world_of_one(tmp_path: Path) -> Iterator[None]:
    dist.init_process_group(
        "gloo", init_method=f"file://{tmp_path / 'rdzv'}", rank=0, world_size=1, timeout=timedelta(seconds=30)
    )
    try:
        yield
    finally:
        dist.destroy_process_group()


@pytest.fixture
def published() -> Iterator[tuple[ProgressPublisher, ProgressReader]]:
    publisher = ProgressPublisher(RecordIdentity(f"instr-{os.getpid()}-{time.monotonic_ns()}", 0, 0))
    reader = ProgressReader(publisher.name, publisher.token)
    inst.instrument(publisher)
    try:
        yield publisher, reader
    finally:
        inst.uninstrument()
        reader.close()
        publisher.close()


def read(reader: ProgressReader) -> tuple[tuple[int, int], int, Stage, int]:
    snapshot = reader.read()
    assert snapshot is not None
    return snapshot.coordinate, snapshot.fingerprint, snapshot.stage, snapshot.collectives_entered


# Positions describe_call reads, per op: (index, parameter name). Compared with the installed
# torch so that a signature change breaks this test instead of silently mis-describing calls.
POSITIONS = {
    "all_reduce": [(0, "tensor"), (1, "op"), (2, "group")],
    "all_gather": [(0, "tensor_list"), (1, "tensor"), (2, "group")],
    "all_gather_into_tensor": [(0, "output_tensor"), (1, "input_tensor"), (2, "group")],
    "reduce_scatter": [(0, "output"), (1, "input_list"), (2, "op"), (3, "group")],
    "reduce_scatter_tensor": [(0, "output"), (1, "input"), (2, "op"), (3, "group")],
    "broadcast": [(0, "tensor"), (1, "src"), (2, "group"), (4, "group_src")],
    "all_to_all": [(0, "output_tensor_list"), (1, "input_tensor_list"), (2, "group")],
    "all_to_all_single": [(0, "output"), (1, "input"), (2, "output_split_sizes"), (3, "input_split_sizes"), (4, "group")],
    "barrier": [(0, "group")],
    "send": [(0, "tensor"), (2, "group"), (3, "tag")],
    "recv": [(0, "tensor"), (2, "group"), (3, "tag")],
    "isend": [(0, "tensor"), (2, "group"), (3, "tag")],
    "irecv": [(0, "tensor"), (2, "group"), (3, "tag")],
    "batch_isend_irecv": [(0, "p2p_op_list")],
}


def test_INSTR_1_argument_positions_match_the_installed_torch() -> None:
    assert set(POSITIONS) | {"_broadcast_coalesced"} == set(inst.COLLECTIVES)
    for op, positions in POSITIONS.items():
        parameters = list(inspect.signature(getattr(dist, op)).parameters)
        for index, name in positions:
            assert parameters[index] == name, f"torch.distributed.{op} parameter {index} is {parameters[index]!r}"
    # INSTR-11: the group argument of every tracked collective, and its async_op flag after it.
    for op, (index, name) in inst.GROUP_ARGUMENT.items():
        if op == "_broadcast_coalesced":
            continue  # a C++ binding without introspectable parameters; checked below
        parameters = list(inspect.signature(getattr(dist, op)).parameters)
        assert parameters[index] == name and parameters[index + 1] == "async_op", (op, parameters)
    # INSTR-16: the group argument of every point-to-point call.
    for op, (index, name) in inst.P2P_GROUP_ARGUMENT.items():
        assert list(inspect.signature(getattr(dist, op)).parameters)[index] == name, op
    doc = dist._broadcast_coalesced.__doc__ or ""
    assert doc.startswith("_broadcast_coalesced(process_group: "), doc[:120]
    assert [
        part.split(":")[0].strip() for part in doc.split("(", 1)[1].split(")", 1)[0].split(", ")] == ["process_group", "tensors", "buffer_size", "src"]


def test_INSTR_1_collectives_publish_entry_exit_and_the_fingerprint(
    world_of_one: None, published: tuple[ProgressPublisher, ProgressReader]
) -> None:
    publisher, reader = published
    inst.mark_step(3)
    seen: list[tuple[tuple[int, int], int, Stage, int]] = []
    original_enter = publisher.enter_collective

    def spy(fp: int) -> None:
        original_enter(fp)
        seen.append(read(reader))

    publisher.enter_collective = spy  # type: ignore[method-assign]
    tensor = torch.ones(4, 8)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    expected = fingerprint(CollectiveCall("all_reduce", None, (TensorMeta("torch.float32", (4, 8)),), reduce_op="MAX"))
    # While inside: op counter advanced, fingerprint and stage set.
    assert seen == [((3, 1), expected, Stage.COLLECTIVE, 1)]
    # After: one more op, no collective in flight.
    assert read(reader) == ((3, 2), 0, Stage.IDLE, 1)
    dist.barrier()
    dist.broadcast(tensor, src=0)
    out = [torch.zeros(4, 8)]
    dist.all_gather(out, tensor)
    assert read(reader) == ((3, 8), 0, Stage.IDLE, 4)


def test_INSTR_2_fingerprints_leave_out_rank_dependent_values() -> None:
    def single(rows: int, splits: list[int] | None) -> int:
        call = inst.describe_call(
            "all_to_all_single", (torch.zeros(rows, 3), torch.zeros(rows, 3), splits, splits), {}
        )
        return fingerprint(call)

    # Uneven splits: each rank's first dimension differs, the fingerprint does not.
    assert single(5, [2, 3]) == single(7, [4, 3])
    assert single(5, [2, 3]) != single(5, None)
    lists_a = inst.describe_call("all_to_all", ([torch.zeros(2), torch.zeros(3)], [torch.zeros(1), torch.zeros(4)]), {})
    lists_b = inst.describe_call("all_to_all", ([torch.zeros(5), torch.zeros(1)], [torch.zeros(2), torch.zeros(2)]), {})
    assert fingerprint(lists_a) == fingerprint(lists_b)
    # The peer of a send is rank-dependent; the tensor and tag are not.
    assert fingerprint(inst.describe_call("send", (torch.zeros(2), 1), {})) == fingerprint(
        inst.describe_call("send", (torch.zeros(2),), {"dst": 3})
    )
    assert fingerprint(inst.describe_call("send", (torch.zeros(2), 1), {"tag": 7})) != fingerprint(
        inst.describe_call("send", (torch.zeros(2), 1), {})
    )
    # A different shape is a different collective.
    assert fingerprint(inst.describe_call("all_reduce", (torch.zeros(4),), {})) != fingerprint(
        inst.describe_call("all_reduce", (torch.zeros(5),), {})
    )


def test_INSTR_3_module_hooks_and_optimizer_publish_progress(
    published: tuple[ProgressPublisher, ProgressReader],
) -> None:
    _, reader = published
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU(), torch.nn.Linear(2, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    assert inst.instrument_module(model) == 3
    inst.instrument_optimizer(optimizer)
    assert read(reader)[0] == (1, 0)
    model(torch.ones(1, 2)).sum().backward()
    assert read(reader)[0] == (1, 3)  # one publish after each of three layers
    optimizer.step()
    assert read(reader)[0] == (2, 0)
    # Before and after: "inside layer k" is told apart from "between layers".
    other = torch.nn.ModuleList([torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)])
    assert inst.instrument_module(other, before_forward=True) == 2
    other[0](torch.ones(1, 2))
    assert read(reader)[0] == (2, 2)


def test_INSTR_3_only_the_outermost_repeated_blocks_are_hooked() -> None:
    blocks = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU()) for _ in range(4)])
    model = torch.nn.Module()
    model.embed = torch.nn.Linear(2, 2)
    model.blocks = blocks
    assert inst._repeated_layers(model) == list(blocks)
    assert inst._repeated_layers(torch.nn.Linear(2, 2))[0].__class__ is torch.nn.Linear


def test_INSTR_4_data_loading_and_checkpoint_stages(
    published: tuple[ProgressPublisher, ProgressReader],
) -> None:
    _, reader = published
    batches = [1, 2]
    staged_during: list[Stage] = []

    class Loader:
        sampler = "kept"

        def __iter__(self) -> Iterator[int]:
            for batch in batches:
                staged_during.append(read(reader)[2])
                yield batch

        def __len__(self) -> int:
            return len(batches)

    loader = inst.instrument_dataloader(Loader(), name="train")
    assert len(loader) == 2 and loader.sampler == "kept"
    assert list(loader) == batches
    assert staged_during == [Stage.DATA_LOADING, Stage.DATA_LOADING]
    snapshot = reader.read()
    assert snapshot is not None and snapshot.completed_stage is Stage.DATA_LOADING
    assert snapshot.completed_stage_key == inst.stage_key("dataloader", "train")
    with inst.checkpoint_io("write", name="step-1"):
        assert read(reader)[2] is Stage.CHECKPOINT_WRITE
    snapshot = reader.read()
    assert snapshot is not None and snapshot.stage is Stage.COMPUTE
    assert snapshot.completed_stage is Stage.CHECKPOINT_WRITE and snapshot.completed_stage_duration_ns > 0
    with pytest.raises(ValueError, match="must be 'read' or 'write', got 'save'"), inst.checkpoint_io("save"):
        pass


def test_INSTR_4_without_instrumentation_the_helpers_change_nothing() -> None:
    assert not inst.instrumented()
    loader = [1, 2]
    assert inst.instrument_dataloader(loader) is loader
    with inst.checkpoint_io("read"):
        pass
    with pytest.raises(inst.InstrumentationError, match="needs instrument"):
        inst.mark_step(1)


def test_INSTR_5_uninstrument_restores_everything(world_of_one: None) -> None:
    import torch.distributed.distributed_c10d as c10d

    originals = {op: getattr(dist, op) for op in inst.COLLECTIVES}
    model = torch.nn.Sequential(torch.nn.Linear(2, 2))
    publisher = ProgressPublisher(RecordIdentity(f"restore-{os.getpid()}-{time.monotonic_ns()}", 0, 0))
    try:
        inst.instrument(publisher)
        with pytest.raises(inst.InstrumentationError, match="already installed"):
            inst.instrument(publisher)
        assert all(getattr(dist, op) is not originals[op] for op in inst.COLLECTIVES)
        assert c10d.all_reduce is dist.all_reduce
        inst.instrument_module(model, before_forward=True)
        assert model[0]._forward_pre_hooks and model[0]._forward_hooks
        inst.uninstrument()
        inst.uninstrument()  # idempotent
        assert all(getattr(dist, op) is originals[op] for op in inst.COLLECTIVES)
        assert c10d.all_reduce is originals["all_reduce"]
        assert not model[0]._forward_pre_hooks and not model[0]._forward_hooks
    finally:
        inst.uninstrument()
        publisher.close()


def test_INSTR_6_instrumentation_never_raises_into_the_trainer(
    world_of_one: None, published: tuple[ProgressPublisher, ProgressReader]
) -> None:
    publisher, reader = published
    # A call the describer cannot handle still runs, with a fallback fingerprint.
    with pytest.raises(Exception) as raised:
        dist.all_reduce("not a tensor")  # type: ignore[arg-type]
    assert "describe" not in str(raised.value)
    active = inst._ACTIVE
    assert active is not None and active.failures == 1
    # A publisher that broke (closed) does not break collectives.
    publisher.close()
    tensor = torch.ones(2)
    dist.all_reduce(tensor)
    assert float(tensor[0]) == 1.0 and active.failures == 3


def test_INSTR_7_the_record_shows_the_collective_a_rank_is_blocked_in(tmp_path: Path) -> None:
    """Four gloo ranks; rank 2 holds back before the second all-reduce, so ranks 0, 1 and 3 are
    blocked inside it. Their records must say so, with the right fingerprint, while they wait."""
    context = torch_ranks.forkserver_context()
    release = context.Event()
    expected = fingerprint(CollectiveCall("all_reduce", None, (TensorMeta("torch.float32", (4,)),), reduce_op="SUM"))
    with torch_ranks.run_ranks(torch_ranks.blocked_rank_program, 4, tmp_path, release) as (control, processes):
        ready = torch_ranks.collect(control, "ready", 4)
        readers = {rank: ProgressReader(name, token) for rank, (name, token) in ready.items()}
        try:
            deadline = time.monotonic() + torch_ranks.RANK_TIMEOUT_S
            while True:
                views = {rank: read(reader) for rank, reader in readers.items()}
                blocked = [r for r in (0, 1, 3) if views[r][2] is Stage.COLLECTIVE and views[r][3] == 2]
                if len(blocked) == 3 and views[2][0] == (1, 2):
                    break
                assert time.monotonic() < deadline, f"ranks never blocked as expected: {views}"
                time.sleep(0.01)
            time.sleep(0.2)  # still blocked a moment later: nothing moves while rank 2 holds
            assert {r: read(readers[r]) for r in (0, 1, 3)} == {
                r: ((1, 3), expected, Stage.COLLECTIVE, 2) for r in (0, 1, 3)
            }
            assert read(readers[2]) == ((1, 2), 0, Stage.IDLE, 1)
            release.set()
            done = torch_ranks.collect(control, "done", 4)
        finally:
            for reader in readers.values():
                reader.close()
    assert done == {rank: ((16.0, True),) for rank in range(4)}
    assert [p.exitcode for p in processes] == [0, 0, 0, 0]


def test_INSTR_9_10_11_every_group_is_tracked_from_any_thread_with_ddps_buffer_broadcast(
    world_of_one: None, published: tuple[ProgressPublisher, ProgressReader]
) -> None:
    """On gloo the source is markers (INSTR-10); a collective from another thread counts for
    completion but publishes no host coordinate (INSTR-9); DDP's buffer broadcast is wrapped and
    tracked (INSTR-1, INSTR-11); a group made after instrument() gets a coordinate of its own
    (INSTR-9), and so do this rank's sends and receives on a group (INSTR-16)."""
    from scout.core.observer import HostContract

    publisher, reader = published
    tracking = inst._ACTIVE.tracking  # type: ignore[union-attr]
    assert tracking is not None and tracking.source_name == "markers" and tracking.tracker is not None
    inst.mark_step(1)
    dist.all_reduce(torch.ones(4))
    thread = threading.Thread(target=lambda: dist.all_reduce(torch.ones(4)))
    thread.start()
    thread.join(30)
    dist._broadcast_coalesced(dist.group.WORLD, [torch.ones(3)], 1 << 20, 0)
    other = dist.new_group([0], backend="gloo")
    dist.all_reduce(torch.ones(2), group=other)
    work = dist.all_reduce(torch.ones(2), async_op=True)
    work.wait()
    assert tracking.tracker.coordinate()[:2] == (4, 4)
    assert tracking.tracker_for(other).coordinate()[:2] == (1, 1)  # type: ignore[union-attr]
    tracking.watcher.poll_once()
    snapshot = reader.read()
    assert snapshot is not None and snapshot.completion is not None
    assert snapshot.contract is HostContract.BLOCKING  # PROGRESS-13: gloo only
    counts = [(slot.enqueued, slot.completed, slot.point_to_point) for slot in snapshot.completion.slots]
    assert counts[0] == (4, 4, False) and (1, 1, False) in counts
    assert snapshot.collectives_entered == 4  # main thread: all_reduce, broadcast, other group, async
    inst.uninstrument()
    assert inst._ACTIVE is None and not tracking.watcher._thread.is_alive()


def test_INSTR_17_functional_collectives_are_counted_and_pending_until_waited(
    world_of_one: None, published: tuple[ProgressPublisher, ProgressReader]
) -> None:
    """DTensor's collectives go through torch.distributed._functional_collectives: each call is a
    marker of its group's tracker, pending (state unknown on gloo: the host may be waiting) until
    ``wait_tensor`` returned for its output -- the first use of the AsyncCollectiveTensor; a
    functional collective that calls another counts once; uninstrument() puts the functions
    back."""
    import torch.distributed._functional_collectives as funcol

    from scout.core.observer import PendingState

    tracking = inst._ACTIVE.tracking  # type: ignore[union-attr]
    assert tracking is not None
    tracker = tracking.tracker_for(dist.group.WORLD)
    assert tracker is not None
    before = tracker.coordinate()[:2]  # type: ignore[index]
    out = funcol.all_reduce(torch.ones(4), "sum", dist.group.WORLD)
    enqueued, completed, _, state, _, _ = tracker.coordinate()  # type: ignore[misc]
    assert (enqueued - before[0], completed - before[1], state) == (1, 0, PendingState.UNKNOWN)
    assert float((out * 2).sum()) == 8.0  # first use: wait_tensor
    assert tracker.coordinate()[:2] == (before[0] + 1, before[1] + 1)  # type: ignore[index]
    gathered = funcol.all_gather_tensor(torch.ones(2), 0, dist.group.WORLD)  # calls all_gather_single
    assert tracker.coordinate()[:2] == (before[0] + 2, before[1] + 1)  # type: ignore[index]
    assert tracker.coordinate()[3] is PendingState.UNKNOWN  # type: ignore[index]
    gathered.wait()  # type: ignore[attr-defined]
    assert tracker.coordinate()[:2] == (before[0] + 2, before[1] + 2)  # type: ignore[index]
    inst.uninstrument()
    assert not getattr(funcol.all_reduce, "__scout_instrumented__", False)
    assert not getattr(funcol.wait_tensor, "__scout_instrumented__", False)


def test_INSTR_6_GUARD_3_a_collective_on_a_group_this_rank_is_not_in_behaves_as_without_scout(
    world_of_one: None, published: tuple[ProgressPublisher, ProgressReader]
) -> None:
    """torch.distributed answers a collective on a group this rank is not a member of with a
    warning and None; instrumented, it did the same only until completion tracking looked the group
    up (KeyError into the training loop). Now it is not tracked and the call is torch's own."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert dist.all_reduce(torch.ones(2), group=dist.GroupMember.NON_GROUP_MEMBER) is None
    tracking = inst._ACTIVE.tracking  # type: ignore[union-attr]
    assert tracking is not None and tracking.register(dist.GroupMember.NON_GROUP_MEMBER) is None
    dist.all_reduce(torch.ones(2))  # the world's collectives still tracked
    assert tracking.tracker is not None and tracking.tracker.coordinate()[:2] == (1, 1)


# -- issue 38: a call's fingerprint is looked up by its arguments' key --------------------------

_DTYPES = (torch.float32, torch.bfloat16, torch.int64, torch.bool)
_tensors = st.builds(lambda dtype, shape: torch.zeros(shape, dtype=dtype), st.sampled_from(_DTYPES),
                     st.lists(st.integers(0, 3), max_size=3).map(tuple))
_calls = st.one_of(
    st.tuples(st.just("all_reduce"), st.tuples(_tensors), st.fixed_dictionaries({}, optional={"op": st.sampled_from(
        [dist.ReduceOp.SUM, dist.ReduceOp.MAX]), "async_op": st.booleans()})),
    st.tuples(st.just("all_gather"), st.tuples(st.lists(_tensors, min_size=1, max_size=3), _tensors), st.just({})),
    st.tuples(st.just("broadcast"), st.tuples(_tensors, st.integers(0, 3)), st.just({})),
    st.tuples(st.just("_broadcast_coalesced"), st.tuples(st.none(), st.lists(_tensors, max_size=4),
                                                         st.sampled_from([0, 1 << 20]), st.integers(0, 1)), st.just({})),
    st.tuples(st.just("all_to_all_single"), st.tuples(_tensors, _tensors, st.none() | st.lists(st.integers(0, 4), max_size=2),
                                                      st.none()), st.just({})),
)


@settings(max_examples=200, deadline=None)
@given(first=_calls, second=_calls)
def test_INSTR_1_a_fingerprint_looked_up_by_its_arguments_is_the_described_one(
    first: tuple[str, tuple[Any, ...], dict[str, Any]], second: tuple[str, tuple[Any, ...], dict[str, Any]],
) -> None:
    """fingerprint_of keeps the fingerprints of calls it described by a key of their arguments
    (a tensor by dtype and shape): every answer, first or looked up, is the described one, so
    a call that differs in anything describe_call reads never gets another call's fingerprint."""
    instrumentation = inst._Instrumentation(publisher=None)  # type: ignore[arg-type]  # not published here
    for op, args, kwargs in (first, second, first, second):
        assert instrumentation.fingerprint_of(op, args, kwargs) == fingerprint(inst.describe_call(op, args, kwargs))
    assert instrumentation.failures == 0
    assert inst.call_key(*first) is not None and inst.call_key("batch_isend_irecv", ([],), {}) is None


def test_INSTR_1_values_equal_as_keys_but_not_to_describe_call_are_told_apart() -> None:
    """1, True and 1.0 are equal dictionary keys; as a broadcast's source only 1 is a rank (the
    others are undescribed, a counted failure), whichever came first."""
    instrumentation = inst._Instrumentation(publisher=None)  # type: ignore[arg-type]
    tensor = torch.zeros(2)
    rank = instrumentation.fingerprint_of("broadcast", (tensor, 1), {})
    assert rank == fingerprint(inst.describe_call("broadcast", (tensor, 1), {})) and instrumentation.failures == 0
    undescribed = [instrumentation.fingerprint_of("broadcast", (tensor, source), {}) for source in (True, 1.0)]
    assert rank not in undescribed and instrumentation.failures == 2


def test_INSTR_1_an_unhashable_argument_is_described_at_every_call() -> None:
    instrumentation = inst._Instrumentation(publisher=None)  # type: ignore[arg-type]
    args = (torch.zeros(3), {"unhashable": 1})  # a dict where the op is expected
    expected = fingerprint(inst.describe_call("all_reduce", args, {}))
    assert instrumentation.fingerprint_of("all_reduce", args, {}) == expected
    assert instrumentation.fingerprint_of("all_reduce", args, {}) == expected and not instrumentation._known_calls


def test_INSTR_6_an_argument_whose_shape_raises_is_an_undescribed_call_not_an_exception() -> None:
    class Odd:
        dtype = "float32"

        @property
        def shape(self) -> tuple[int, ...]:
            raise RuntimeError("no shape here")

    instrumentation = inst._Instrumentation(publisher=None)  # type: ignore[arg-type]
    undescribed = fingerprint(CollectiveCall("all_reduce", detail=(("undescribed", 1),)))
    assert instrumentation.fingerprint_of("all_reduce", (Odd(),), {}) == undescribed
    assert instrumentation.failures == 1
