"""``scout serve RUN_DIR [--port N] [--host ADDR]``: a live page of a run, while it runs and after
it ended (scout/ops/web.py; spec/ops.md OPS-6): the rank x step timeline of progress, faults,
stragglers and checkpoint trust, every report with its evidence, each checkpoint's coverage
certificate. Read-only, on loopback unless ``--host`` says otherwise, no external asset. It
answers only requests whose ``Host`` names it (``--allow-host NAME`` adds a name: a proxy's, or a
DNS name of a node it serves on), closes a connection that sends nothing for ``--read-timeout-s``
seconds, and reads a long reports file from its end (spec/ops.md OPS-14, OPS-15).

Prints one line with the page's address once it serves; stops on Ctrl-C (or SIGTERM). Exit
status: 0 stopped, 2 the run directory or the address cannot be used.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from pathlib import Path
from typing import Any


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("serve", help="serve a live page of a run directory (read-only, loopback)")
    parser.add_argument("run_dir", type=Path, help="the run_dir given to scout.attach")
    parser.add_argument("--port", type=int, default=8765, help="TCP port (default 8765; 0: any free port)")
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to bind (default 127.0.0.1: only this machine; the page is read-only)")
    parser.add_argument("--allow-host", action="append", default=[], metavar="NAME",
                        help="also answer requests for this host name (repeatable); by default only the names of "
                             "the bound address (127.0.0.1, localhost, ::1 on loopback)")
    parser.add_argument("--read-timeout-s", type=float, default=None,
                        help="close a connection that sends nothing for this long (default 10)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from scout.ops.web import READ_TIMEOUT_S, make_server

    try:
        server = make_server(args.run_dir, args.host, args.port, allow_hosts=tuple(args.allow_host),
                             read_timeout_s=READ_TIMEOUT_S if args.read_timeout_s is None else args.read_timeout_s)
    except (FileNotFoundError, ValueError, OSError) as error:
        print(f"scout serve: {error}", file=sys.stderr)
        return 2
    host, port = str(server.server_address[0]), int(server.server_address[1])
    shown = f"[{host}]" if ":" in host else host
    print(f"scout serve: http://{shown}:{port}/ ({args.run_dir})", flush=True)

    def stop(_signum: int, _frame: Any) -> None:
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    try:
        server.serve_forever(poll_interval=0.25)
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0
