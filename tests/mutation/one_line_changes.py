"""The issue-26 rule tests against the one-line changes they must catch (survivors.md, "The
three rules"): each change is applied to a copy of the tree in a temporary directory, and the
rule's tests run there must fail. Run: ``./dev py tests/mutation/one_line_changes.py`` (about a
minute; not part of CI). Exit 1 if a change is not caught or a change no longer applies."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CASES = [
 ("codec: trailing bytes accepted", "scout/transport/codec.py", "    if offset != len(view):", "    if offset > len(view):",
  ["tests/transport/test_codec.py::test_codec_a_payload_with_one_trailing_byte_is_refused",
   "tests/observer/test_wire_frames.py::test_OBS_AUTH_8_a_body_with_one_trailing_byte_is_refused"]),
 ("manifest: a longer body accepted", "scout/gate/manifest.py", "    if len(body) != declared_bytes:", "    if len(body) < declared_bytes:",
  ["tests/unit/test_manifest_framing.py::test_GATE_M2_a_generation_file_with_one_trailing_byte_is_refused"]),
 ("channel: first tag byte not compared", "scout/observer/channel.py", "hmac.compare_digest(tag, self._tag(prefix, body))", "hmac.compare_digest(tag[1:], self._tag(prefix, body)[1:])",
  ["tests/observer/test_channel_rules.py::test_OBS_AUTH_4_a_tag_that_differs_in_any_one_byte_is_refused"]),
 ("channel: a middle tag byte not compared", "scout/observer/channel.py", "hmac.compare_digest(tag, self._tag(prefix, body))", "hmac.compare_digest(tag[:8] + tag[9:], (lambda t: t[:8] + t[9:])(self._tag(prefix, body)))",
  ["tests/observer/test_channel_rules.py::test_OBS_AUTH_4_a_tag_that_differs_in_any_one_byte_is_refused"]),
 ("channel: last tag byte not compared", "scout/observer/channel.py", "hmac.compare_digest(tag, self._tag(prefix, body))", "hmac.compare_digest(tag[:-1], self._tag(prefix, body)[:-1])",
  ["tests/observer/test_channel_rules.py::test_OBS_AUTH_4_a_tag_that_differs_in_any_one_byte_is_refused"]),
 ("recovery: 'verified' restores the latest restorable", "scout/gate/recovery.py", "        checkpoint = verified.id", "        checkpoint = context.latest.id if context.latest is not None and context.latest.trust in RESTORABLE else verified.id",
  ["tests/model_check/test_recovery_restores.py"]),
 ("recovery: 'latest' restores the verified one when there is one", "scout/gate/recovery.py", "        checkpoint = latest.id", "        checkpoint = context.verified.id if context.verified is not None else latest.id",
  ["tests/model_check/test_recovery_restores.py"]),
]

def main() -> int:
    uncaught = 0
    for name, path, old, new, tests in CASES:
        with tempfile.TemporaryDirectory(prefix="scout-one-line-") as scratch:
            uncaught += not caught(Path(scratch), name, path, old, new, tests)
    return 1 if uncaught else 0


def caught(work: Path, name: str, path: str, old: str, new: str, tests: list[str]) -> bool:
    for item in ("scout", "tests", "spec"):
        shutil.copytree(REPO / item, work / item, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy2(REPO / "pyproject.toml", work / "pyproject.toml")
    target = work / path
    text = target.read_text(encoding="utf-8")
    if text.count(old) != 1:
        print(f"{name}: the line {old.strip()!r} is not in {path} once; update this script", flush=True)
        return False
    target.write_text(text.replace(old, new), encoding="utf-8")
    # The copy first on the path: the editable install points at the repository.
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *tests], cwd=work,
                         env=dict(os.environ, PYTHONPATH=str(work)), capture_output=True, text=True, timeout=600,
                         check=False)
    lines = [line for line in run.stdout.splitlines() if " passed" in line or " failed" in line]
    verdict = "caught" if run.returncode == 1 and lines and " failed" in lines[-1] else "NOT CAUGHT"
    print(f"{verdict}: {name}: {path}: {old.strip()!r} -> {new.strip()!r}: {lines[-1] if lines else run.stdout[-300:]}",
          flush=True)
    return verdict == "caught"


if __name__ == "__main__":
    sys.exit(main())
