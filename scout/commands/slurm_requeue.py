"""``scout slurm-requeue JOB_ID RUN_DIR``: requeue a Slurm batch job so that its next run never
lands on a host scout named (``RUN_DIR/exclude_hosts.txt``; spec/ops.md OPS-8, OPS-10,
docs/cluster.md).

The job is requeued held, the hosts are added to its ``ExcNodeList``, the job is read back to
check that each is excluded, and only then released. Run it where ``scontrol`` reaches the
controller (a login node, a watcher), not inside the job: a requeue ends the job's processes.

No exclude file is not "nothing to exclude" (OPS-10): a misspelt RUN_DIR, or a node-local run_dir
read from another machine, looks the same. So a missing file fails (exit 2, the job untouched)
unless ``--allow-no-exclude-file`` says that requeueing with no host excluded is meant -- a run in
which scout named no host, on a run directory every node shares. An exclude file that cannot be
used (a directory, not UTF-8, too long for one ``scontrol`` argument) fails the same way, before
the job is touched. ``--dry-run`` prints what would be excluded (and the same problems). Exit
status: 0 requeued (or dry run), 2 nothing was requeued: the exclude file is missing or unusable,
a Slurm command failed or the job cannot be requeued (it is then left held when this command
held it; the message says how to release it).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

#: The flag that requeues without an exclude file (OPS-10).
ALLOW_MISSING: str = "--allow-no-exclude-file"


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "slurm-requeue", help="requeue a Slurm batch job excluding the hosts in RUN_DIR/exclude_hosts.txt")
    parser.add_argument("job_id", help="the Slurm job id (SLURM_JOB_ID)")
    parser.add_argument("run_dir", type=Path, help="the run_dir given to scout.attach (holds exclude_hosts.txt)")
    parser.add_argument("--exclude-file", type=Path, default=None,
                        help="read the hosts from this file instead of RUN_DIR/exclude_hosts.txt")
    parser.add_argument(ALLOW_MISSING, dest="allow_missing", action="store_true",
                        help="requeue even when the exclude file does not exist, excluding no host (for a run in "
                             "which scout named none, on a run_dir every node shares)")
    parser.add_argument("--timeout-s", type=float, default=60.0,
                        help="how long to wait for the requeued job to be pending (default 60)")
    parser.add_argument("--dry-run", action="store_true", help="print the hosts that would be excluded; change nothing")
    parser.set_defaults(func=run)


def _missing(path: Path, run_dir: Path, explicit: bool) -> str:
    """OPS-10: why a missing exclude file is refused, and what to do."""
    if explicit:
        where = f"the exclude file {path} does not exist"
    elif not run_dir.is_dir():
        where = f"{run_dir} is not a directory here, so there is no {path.name} to read"
    else:
        where = f"{path} does not exist"
    return (f"{where}: no host would be excluded, and nothing was requeued. Check RUN_DIR (misspelt? a node-local "
            f"run_dir lives on the job's nodes, not here: give --exclude-file with the hosts scout named there); to "
            f"requeue with no host excluded on purpose (scout named none), pass {ALLOW_MISSING}")


def run(args: argparse.Namespace) -> int:
    from scout.ops.slurm import SlurmError, read_exclude_file, requeue_excluding

    path = args.exclude_file or args.run_dir / "exclude_hosts.txt"
    try:
        hosts = read_exclude_file(path)
        source = f"from {path}"
    except FileNotFoundError:
        if not args.allow_missing:
            print(f"scout slurm-requeue: {_missing(path, args.run_dir, args.exclude_file is not None)}",
                  file=sys.stderr)
            return 2
        hosts, source = [], f"{path} does not exist; {ALLOW_MISSING}: no host excluded"
    except SlurmError as error:
        print(f"scout slurm-requeue: {error}; nothing was requeued", file=sys.stderr)
        return 2
    if args.dry_run:
        print(f"scout slurm-requeue: job {args.job_id} would be requeued excluding "
              f"{', '.join(hosts) if hosts else 'no host'} ({source})")
        return 0
    try:
        result = requeue_excluding(args.job_id, hosts, timeout_s=args.timeout_s)
    except SlurmError as error:
        print(f"scout slurm-requeue: {error}", file=sys.stderr)
        return 2
    added = f", {', '.join(result.added)} added {source}" if result.added else f" (no host added: {source})"
    print(f"scout slurm-requeue: job {result.job_id} ({result.state_before}) requeued; its ExcNodeList is "
          f"{','.join(result.excluded) or '(none)'}{added}")
    return 0
