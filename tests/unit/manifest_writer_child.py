"""A manifest writer process for the crash tests (test_manifest_crash.py); imports only the
manifest module, so it starts in tens of milliseconds.

    python manifest_writer_child.py DIR JOB PAYLOADS.json GENERATIONS [KILL_GENERATION KILL_STAGE]

Opens DIR as the one writer (resuming from the newest good generation g0) and commits
generations g0+1 .. GENERATIONS, generation g holding payload ``payloads[(g - 1) % len]`` and, in
the first pass over the payloads, appending the trust transitions it adds to the trust log. After
each commit it prints ``committed <g>`` and flushes, so the parent knows exactly what was
acknowledged. With KILL_GENERATION and KILL_STAGE it sends itself SIGKILL right after that write
step of that generation (the stages are manifest.WRITE_STAGES).
"""

from __future__ import annotations

import json
import os
import signal
import sys

from scout.gate.manifest import ManifestWriter


def write(directory: str, job_id: str, payloads: list, generations: int, hook=None, out=print) -> None:
    """Resume DIR and commit up to GENERATIONS (also called in-process by the crash test to
    finish a killed writer's run)."""
    with ManifestWriter(directory, job_id, hook=hook) as writer:
        out(f"resumed {writer.generation}")
        while writer.generation < generations:
            index = writer.generation
            payload = payloads[index % len(payloads)]
            records = []
            if 0 < index < len(payloads):
                records = payload["transitions"][len(payloads[index - 1]["transitions"]):]
            generation = writer.commit(payload, records)
            out(f"committed {generation}")


def main(argv: list[str]) -> int:
    directory, job_id, payloads_path, generations = argv[1], argv[2], argv[3], int(argv[4])
    kill_at = (int(argv[5]), argv[6]) if len(argv) > 6 else None
    with open(payloads_path, encoding="utf-8") as file:
        payloads = json.load(file)

    def hook(stage: str, generation: int) -> None:
        if kill_at == (generation, stage):
            os.kill(os.getpid(), signal.SIGKILL)

    write(directory, job_id, payloads, generations, hook, lambda line: print(line, flush=True))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
