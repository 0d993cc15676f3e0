"""``scout slurm-requeue JOB_ID RUN_DIR``: requeue a Slurm batch job so that its next run never
lands on a host scout named (``RUN_DIR/exclude_hosts.txt``; spec/ops.md OPS-8, docs/cluster.md).

The job is requeued held, the hosts are added to its ``ExcNodeList``, the job is read back to
check that each is excluded, and only then released. Run it where ``scontrol`` reaches the
controller (a login node, a watcher), not inside the job: a requeue ends the job's processes.
``--dry-run`` prints what would be excluded. Exit status: 0 requeued (or dry run), 2 a Slurm
command failed or the job cannot be requeued (it is then left held when it was already held by
this command; the message says how to release it).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "slurm-requeue", help="requeue a Slurm batch job excluding the hosts in RUN_DIR/exclude_hosts.txt")
    parser.add_argument("job_id", help="the Slurm job id (SLURM_JOB_ID)")
    parser.add_argument("run_dir", type=Path, help="the run_dir given to scout.attach (holds exclude_hosts.txt)")
    parser.add_argument("--exclude-file", type=Path, default=None,
                        help="read the hosts from this file instead of RUN_DIR/exclude_hosts.txt")
    parser.add_argument("--timeout-s", type=float, default=60.0,
                        help="how long to wait for the requeued job to be pending (default 60)")
    parser.add_argument("--dry-run", action="store_true", help="print the hosts that would be excluded; change nothing")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from scout.ops.slurm import SlurmError, excluded_hosts, requeue_excluding

    path = args.exclude_file or args.run_dir / "exclude_hosts.txt"
    hosts = excluded_hosts(path)
    if args.dry_run:
        print(f"scout slurm-requeue: job {args.job_id} would be requeued excluding "
              f"{', '.join(hosts) if hosts else 'no host'} (from {path})")
        return 0
    try:
        result = requeue_excluding(args.job_id, hosts, timeout_s=args.timeout_s)
    except SlurmError as error:
        print(f"scout slurm-requeue: {error}", file=sys.stderr)
        return 2
    print(f"scout slurm-requeue: job {result.job_id} ({result.state_before}) requeued; its ExcNodeList is "
          f"{','.join(result.excluded) or '(none)'}" + (f", {', '.join(result.added)} added from {path}" if result.added
                                                         else ""))
    return 0
