"""Flight Recorder dumps in the format torch 2.13 writes (``_dump_fr_trace``, version 2.10), for
the CPU tests of the decision logic (scout/observer/flight_recorder.py, spec/observer.md INSTR-12).

``GLOO_BUFFER_BROADCAST_PENDING`` was recorded from a real 2-rank gloo job (``TORCH_FR_BUFFER_SIZE=32``):
a DDP model with one registered buffer, rank 1 asleep before its second forward, dumped by rank 0
while it waited in DDP's buffer broadcast (frames, thread names and ids removed). The NCCL dumps
are written by hand in the same format, with the fields NCCL adds: ``started`` and ``completed``
states (``TORCH_NCCL_ENABLE_TIMING=1``), discovery times and ``last_started_collective``.

``GLOO_SUBGROUP_PENDING`` (and its status-only dump) is a real gloo dump kept as recorded, thread
name and id included: ``tests/observer/record_fr_dump.py`` records it again. ``NCCL_SUBGROUP_PENDING``
is NCCL's recorder as ``_dump_nccl_trace(True, False, True)`` returns it in torch 2.13, written from
torch's own source (the installed ``torch/include/torch/csrc/distributed/c10d/FlightRecorderDetail.hpp``:
``dump`` and ``getCollectiveTrace``; ``dump_nccl_trace`` in ``ProcessGroupNCCL.cpp`` dumps the CUDA
recorder with the communicators' state, present only on NCCLX and ROCm builds): the groups' ranks
in ``pg_config``, NCCL's version, thread name and id, and -- ``onlyActive`` -- no completed entry.
"""

from __future__ import annotations

from typing import Any

GLOO_BUFFER_BROADCAST_PENDING: dict[str, Any] = {'comm_lib_version': '',
 'entries': [{'collective_seq_id': 1,
              'input_dtypes': ['Long'],
              'input_sizes': [[1]],
              'is_p2p': False,
              'op_id': 1,
              'output_dtypes': ['Long'],
              'output_sizes': [[2, 1]],
              'p2p_seq_id': 0,
              'pg_id': 0,
              'process_group': ('0', 'default_pg'),
              'profiling_name': 'gloo:all_gather',
              'record_id': 0,
              'retired': True,
              'state': 'scheduled',
              'time_created_ns': 1796164108494495645,
              'time_discovered_completed_ns': None,
              'time_discovered_started_ns': None,
              'timeout_ms': 1800000},
             {'collective_seq_id': 2,
              'input_dtypes': ['Long'],
              'input_sizes': [[6]],
              'is_p2p': False,
              'op_id': 2,
              'output_dtypes': ['Long'],
              'output_sizes': [[6]],
              'p2p_seq_id': 0,
              'pg_id': 0,
              'process_group': ('0', 'default_pg'),
              'profiling_name': 'gloo:broadcast',
              'record_id': 1,
              'retired': True,
              'state': 'scheduled',
              'time_created_ns': 1796164110087854684,
              'time_discovered_completed_ns': None,
              'time_discovered_started_ns': None,
              'timeout_ms': 1800000},
             {'collective_seq_id': 3,
              'input_dtypes': ['Float'],
              'input_sizes': [[9]],
              'is_p2p': False,
              'op_id': 3,
              'output_dtypes': ['Float'],
              'output_sizes': [[9]],
              'p2p_seq_id': 0,
              'pg_id': 0,
              'process_group': ('0', 'default_pg'),
              'profiling_name': 'gloo:broadcast',
              'record_id': 2,
              'retired': True,
              'state': 'scheduled',
              'time_created_ns': 1796164110088873325,
              'time_discovered_completed_ns': None,
              'time_discovered_started_ns': None,
              'timeout_ms': 1800000},
             {'collective_seq_id': 4,
              'input_dtypes': ['Float'],
              'input_sizes': [[3]],
              'is_p2p': False,
              'op_id': 4,
              'output_dtypes': ['Float'],
              'output_sizes': [[3]],
              'p2p_seq_id': 0,
              'pg_id': 0,
              'process_group': ('0', 'default_pg'),
              'profiling_name': 'gloo:broadcast',
              'record_id': 3,
              'retired': True,
              'state': 'scheduled',
              'time_created_ns': 1796164110119615855,
              'time_discovered_completed_ns': None,
              'time_discovered_started_ns': None,
              'timeout_ms': 1800000},
             {'collective_seq_id': 5,
              'input_dtypes': ['Float'],
              'input_sizes': [[6]],
              'is_p2p': False,
              'op_id': 5,
              'output_dtypes': ['Float'],
              'output_sizes': [[6]],
              'p2p_seq_id': 0,
              'pg_id': 0,
              'process_group': ('0', 'default_pg'),
              'profiling_name': 'gloo:all_reduce',
              'record_id': 4,
              'retired': True,
              'state': 'scheduled',
              'time_created_ns': 1796164110156991666,
              'time_discovered_completed_ns': None,
              'time_discovered_started_ns': None,
              'timeout_ms': 1800000},
             {'collective_seq_id': 6,
              'input_dtypes': ['Int'],
              'input_sizes': [[3]],
              'is_p2p': False,
              'op_id': 6,
              'output_dtypes': ['Int'],
              'output_sizes': [[3]],
              'p2p_seq_id': 0,
              'pg_id': 0,
              'process_group': ('0', 'default_pg'),
              'profiling_name': 'gloo:broadcast',
              'record_id': 5,
              'retired': False,
              'state': 'scheduled',
              'time_created_ns': 1796164110183749592,
              'time_discovered_completed_ns': None,
              'time_discovered_started_ns': None,
              'timeout_ms': 1800000}],
 'pg_config': {'': {'desc': '', 'name': '', 'ranks': '[0, 1]'}},
 'pg_status': {'0': {'last_completed_collective': 5,
                     'last_enqueued_collective': 6,
                     'last_started_collective': -1}},
 'version': '2.10'}


def _nccl_entry(seq: int, name: str, size: int, state: str, *, created_ns: int, group: str = "0",
                pg_id: int = 0, p2p: bool = False, desc: str = "default_pg", record_id: int | None = None
                ) -> dict[str, Any]:
    return {
        "record_id": seq - 1 if record_id is None else record_id, "pg_id": pg_id, "process_group": (group, desc),
        "thread_name": "python", "thread_id": "139872412489536", "collective_seq_id": seq,
        "p2p_seq_id": 0, "op_id": seq, "profiling_name": f"nccl:{name}", "time_created_ns": created_ns,
        "duration_ms": 1.5 if state == "completed" else None, "input_sizes": [[size]], "input_dtypes": ["Float"],
        "output_sizes": [[size]], "output_dtypes": ["Float"], "state": state,
        "time_discovered_started_ns": created_ns + 1000 if state in ("started", "completed") else None,
        "time_discovered_completed_ns": created_ns + 2000 if state == "completed" else None,
        "retired": state == "completed", "timeout_ms": 600000, "is_p2p": p2p,
    }


def nccl_dump(states: list[str], *, created_ns: int = 1_800_000_000_000_000_000, size: int = 1024) -> dict[str, Any]:
    """A one-group NCCL dump whose collectives 1..n are all-reduces in ``states`` (``completed``,
    ``started``, ``scheduled``), with the group status NCCL keeps for them."""
    entries = [_nccl_entry(i + 1, "all_reduce", size, s, created_ns=created_ns + i) for i, s in enumerate(states)]
    done = [i + 1 for i, s in enumerate(states) if s == "completed"]
    started = [i + 1 for i, s in enumerate(states) if s in ("started", "completed")]
    return {
        "version": "2.10", "comm_lib_version": "2.21.5", "pg_config": {"0": {"name": "0", "desc": "default_pg",
                                                                          "ranks": "[0, 1, 2, 3]"}},
        "pg_status": {"0": {"last_enqueued_collective": len(states),
                            "last_started_collective": max(started, default=-1),
                            "last_completed_collective": max(done, default=0)}},
        "entries": entries,
    }


GLOO_SUBGROUP_PENDING: dict[str, Any] = {'comm_lib_version': '',
 'entries': [{'collective_seq_id': 1,
              'input_dtypes': ['Float'],
              'input_sizes': [[4]],
              'is_p2p': False,
              'op_id': 1,
              'output_dtypes': ['Float'],
              'output_sizes': [[4]],
              'p2p_seq_id': 0,
              'pg_id': 0,
              'process_group': ('0', 'default_pg'),
              'profiling_name': 'gloo:all_reduce',
              'record_id': 0,
              'retired': True,
              'state': 'scheduled',
              'thread_id': '140318546557824',
              'thread_name': 'python',
              'time_created_ns': 1796482854433103856,
              'time_discovered_completed_ns': None,
              'time_discovered_started_ns': None,
              'timeout_ms': 60000},
             {'collective_seq_id': 1,
              'input_dtypes': ['Float'],
              'input_sizes': [[4]],
              'is_p2p': False,
              'op_id': 1,
              'output_dtypes': ['Float'],
              'output_sizes': [[4]],
              'p2p_seq_id': 0,
              'pg_id': 1,
              'process_group': ('1', 'undefined'),
              'profiling_name': 'gloo:all_reduce',
              'record_id': 1,
              'retired': True,
              'state': 'scheduled',
              'thread_id': '140318546557824',
              'thread_name': 'python',
              'time_created_ns': 1796482854436457108,
              'time_discovered_completed_ns': None,
              'time_discovered_started_ns': None,
              'timeout_ms': 1800000},
             {'collective_seq_id': 2,
              'input_dtypes': ['Double'],
              'input_sizes': [[2, 3]],
              'is_p2p': False,
              'op_id': 2,
              'output_dtypes': ['Double'],
              'output_sizes': [[2, 3]],
              'p2p_seq_id': 0,
              'pg_id': 1,
              'process_group': ('1', 'undefined'),
              'profiling_name': 'gloo:all_reduce',
              'record_id': 2,
              'retired': False,
              'state': 'scheduled',
              'thread_id': '140318546557824',
              'thread_name': 'python',
              'time_created_ns': 1796482854437084163,
              'time_discovered_completed_ns': None,
              'time_discovered_started_ns': None,
              'timeout_ms': 1800000}],
 'pg_config': {'': {'desc': '', 'name': '', 'ranks': '[]'}},
 'pg_status': {'0': {'last_completed_collective': 1,
                     'last_enqueued_collective': 1,
                     'last_started_collective': -1},
               '1': {'last_completed_collective': 1,
                     'last_enqueued_collective': 2,
                     'last_started_collective': -1}},
 'version': '2.10'}

GLOO_SUBGROUP_PENDING_STATUS: dict[str, Any] = {'comm_lib_version': '',
 'pg_config': {'': {'desc': '', 'name': '', 'ranks': '[]'}},
 'pg_status': {'0': {'last_completed_collective': 1,
                     'last_enqueued_collective': 1,
                     'last_started_collective': -1},
               '1': {'last_completed_collective': 1,
                     'last_enqueued_collective': 2,
                     'last_started_collective': -1}},
 'version': '2.10'}


def nccl_subgroup_pending() -> dict[str, Any]:
    """NCCL's recorder (``_dump_nccl_trace(True, False, True)``, torch 2.13, timing on) of a
    4-rank job with a sub-group ``1`` of ranks 0 and 1: the default group has completed its 11
    collectives and enqueued a 12th the stream has not reached; the sub-group completed 5 of 7,
    its 6th (a bf16 reduce-scatter) started, its 7th scheduled. Completed entries are left out
    (``onlyActive``)."""
    created_ns = 1_796_482_900_000_000_000
    entries = [
        _nccl_entry(12, "all_reduce", 4096, "scheduled", created_ns=created_ns + 50, record_id=17),
        _nccl_entry(6, "_reduce_scatter_base", 8192, "started", created_ns=created_ns + 10, group="1", pg_id=1,
                    desc="undefined", record_id=15),
        _nccl_entry(7, "all_reduce", 16, "scheduled", created_ns=created_ns + 20, group="1", pg_id=1,
                    desc="undefined", record_id=16),
    ]
    entries[1].update(input_dtypes=["BFloat16"], output_dtypes=["BFloat16"], output_sizes=[[4096]])
    for entry in entries:
        entry["retired"] = False
    return {
        "version": "2.10",
        "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1, 2, 3]"},
                      "1": {"name": "1", "desc": "undefined", "ranks": "[0, 1]"}},
        "comm_lib_version": "2.27.5",
        "pg_status": {"0": {"last_enqueued_collective": 12, "last_started_collective": 11,
                            "last_completed_collective": 11},
                      "1": {"last_enqueued_collective": 7, "last_started_collective": 6,
                            "last_completed_collective": 5}},
        "entries": entries,
    }


def status_only(dump: dict[str, Any]) -> dict[str, Any]:
    """The same recorder dumped without its entries (``includeCollectives=False``)."""
    return {key: value for key, value in dump.items() if key != "entries"}
