"""One rank of the MPI conformance run. Pytest-free; launched by test_conformance_mpi.py as

    mpiexec -n 4 python -m tests.transport.mpi_worker OUT_DIR

Every rank runs the shared binding cases (binding_cases.py), the MPI-specific cases
(mpi_cases.py) and,
when tests/transport/scenarios.py exists, the shared conformance scenarios, then writes
``OUT_DIR/rank<r>.json``. Every wait is bounded, so a broken binding ends in a failed case,
never in a hung mpiexec (the test also bounds the whole run).
"""

from __future__ import annotations

import json
import sys
import traceback
from pathlib import Path
from typing import Any

from mpi4py import MPI

from scout.transport import codec
from scout.transport._binding import Op, Stream, group_key, pack_frame
from scout.transport.base import Group
from scout.transport.mpi import MpiTransport
from scout.transport.mpi.transport import FRAME_TAG
from tests.transport import binding_cases as cases
from tests.transport.mpi_cases import MPI_CASES
from tests.transport.scenario_runner import run_shared_scenarios


class MpiHooks:
    binding = "mpi"

    def inject(self, transport: MpiTransport, group: Group, round_id: int, kind: str) -> None:
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
        for peer in group.ranks:
            if peer != transport.rank:
                transport.comm.Send([data, MPI.BYTE], peer, FRAME_TAG)

    def cleanup_injected(self, transport: MpiTransport) -> None:
        pass

    def fresh_transport(self) -> MpiTransport:
        return MpiTransport(MPI.COMM_WORLD)


def main(out_dir: Path) -> None:
    transport = MpiTransport(MPI.COMM_WORLD)
    hooks = MpiHooks()
    results: dict[str, Any] = {}
    try:
        results.update(cases.run_cases(transport, hooks, cases.CASES))
        results.update(cases.run_cases(transport, hooks, MPI_CASES))
        results["scenarios"] = run_shared_scenarios(hooks.fresh_transport)
    except Exception:
        results["worker_error"] = traceback.format_exc()
    finally:
        transport.close()
    (out_dir / f"rank{MPI.COMM_WORLD.Get_rank()}.json").write_text(
        json.dumps(results, default=repr)
    )


if __name__ == "__main__":
    main(Path(sys.argv[1]))
