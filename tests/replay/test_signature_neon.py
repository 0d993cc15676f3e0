"""The NEON path of the native signature kernel on aarch64 (spec/replay.md SIG-9), checked on
any host that has an aarch64 cross compiler and qemu's user-mode emulator (Debian:
``gcc-aarch64-linux-gnu qemu-user``); skipped with the reason elsewhere. On an aarch64 host the
NEON path runs natively in test_signature.py's per-path tests instead."""

from __future__ import annotations

import random
import shutil
import subprocess
from pathlib import Path

import pytest

from scout.replay._native import KERNEL_SOURCE, PATH_NAMES
from scout.replay.signature import content_reference

CROSS = shutil.which("aarch64-linux-gnu-gcc")
QEMU = shutil.which("qemu-aarch64")

_DRIVER = r"""
#include <stdio.h>
int main(void) {
    static unsigned char buffer[1 << 16];
    unsigned long length;
    printf("paths %d\n", scout_signature_paths());
    while (scanf("%lu", &length) == 1) {
        for (unsigned long i = 0; i < length; ++i) {
            unsigned value;
            if (scanf("%2x", &value) != 1) return 2;
            buffer[i + 1] = (unsigned char)value; /* +1: unaligned loads */
        }
        for (int path = 0; path < 4; ++path)
            if (scout_signature_paths() >> path & 1)
                printf("%lu %d %llu\n", length, path,
                       (unsigned long long)scout_signature_content_path(buffer + 1, length, path));
    }
    return 0;
}
"""


@pytest.mark.skipif(CROSS is None or QEMU is None, reason="needs aarch64-linux-gnu-gcc and qemu-aarch64")
def test_SIG_9_neon_path_equals_the_definition_under_qemu(tmp_path: Path) -> None:
    source = tmp_path / "neon.c"
    source.write_text(KERNEL_SOURCE + _DRIVER)
    binary = tmp_path / "neon"
    subprocess.run([CROSS, "-O3", "-static", str(source), "-o", str(binary)], check=True, timeout=120)
    generator = random.Random(9)
    cases = {}
    for length in [*range(0, 70), 127, 128, 129, 255, 256, 257, 1000, 4099]:
        cases[length] = bytes(generator.randrange(256) for _ in range(length))
    stdin = "".join(f"{length} {data.hex()}\n" for length, data in cases.items())
    completed = subprocess.run(
        [QEMU, str(binary)], input=stdin, capture_output=True, text=True, timeout=120, check=True
    )
    lines = completed.stdout.splitlines()
    mask = int(lines[0].split()[1])
    assert mask >> PATH_NAMES.index("neon") & 1, f"the NEON path was not compiled in (mask {mask})"
    checked = set()
    for line in lines[1:]:
        length, path, value = (int(field) for field in line.split())
        assert value == content_reference(cases[length]), (PATH_NAMES[path], length)
        checked.add(PATH_NAMES[path])
    assert checked == {"scalar", "neon"}
