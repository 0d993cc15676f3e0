"""The out-of-band observer: progress record, fingerprints, instrumentation, lifecycle machine."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SPEC_PATH = REPO / "spec" / "observer.toml"
