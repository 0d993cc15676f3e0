"""The out-of-band observer: progress record, fingerprints, instrumentation, lifecycle machine."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SPEC_PATH = REPO / "spec" / "observer.toml"


def flat(record: dict) -> dict:  # type: ignore[type-arg]
    """An observer report (``scout.report/1``) with its evidence's fields at the top level, as
    the assertions read them: scope, outcome (the finding), attributed/missing/group ranks."""
    evidence = record.get("evidence", {})
    return {
        **record,
        "scope": evidence.get("scope"),
        "outcome": evidence.get("finding", record["kind"]),
        "attributed_ranks": evidence.get("attributed_ranks", record["ranks"]),
        "missing_ranks": evidence.get("missing_ranks", []),
        "group_ranks": evidence.get("group_ranks"),
    }
