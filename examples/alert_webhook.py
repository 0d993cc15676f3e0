"""Post scout's fault reports to a Slack-style incoming webhook: an ``on_report`` command.

    ALERT_WEBHOOK_URL=https://hooks.slack.com/services/... \\
    SCOUT_ON_REPORT="python examples/alert_webhook.py" torchrun ... train.py

scout's node sidecar runs it once per new report with the report (``scout.report/1``) as JSON on
standard input (docs/metrics.md, "Alerts"). It posts ``{"text": ...}`` -- the body Slack,
Mattermost, Rocket.Chat and Google Chat incoming webhooks accept -- for the kinds in
ALERT_KINDS (comma-separated; default: every fault kind, not checkpoint trust or restarts)
and ignores the others. Only the standard library; every wait is bounded (ALERT_TIMEOUT_S,
default 5 s). Its variables are not ``SCOUT_*``: that prefix is scout's own settings, which
``scout.attach`` checks. Exit status: 0 posted or ignored, 1 the post failed, 2 bad input or
settings.
"""

from __future__ import annotations

import json
import os
import sys
import urllib.error
import urllib.request

FAULT_KINDS = ("hang", "data_stall", "checkpoint_stall", "desync", "group_stall", "unresponsive", "inconclusive",
               "observer_failure", "sdc", "straggler")


def message(record: dict) -> str:
    """One line a person reads in a chat channel."""
    where = f" at step {record['step']}" if record.get("step") is not None else ""
    ranks = f" rank(s) {', '.join(str(r) for r in record['ranks'])}" if record.get("ranks") else ""
    hosts = f" on {', '.join(record['hosts'])}" if record.get("hosts") else ""
    return (f"scout: {record['kind']}{ranks}{hosts}{where}: {record['reason']} "
            f"(job {record.get('job_id')}, attempt {record.get('generation')})")


def main() -> int:
    url = os.environ.get("ALERT_WEBHOOK_URL", "")
    if not url.startswith(("http://", "https://")):
        print(f"alert_webhook: ALERT_WEBHOOK_URL must be an http(s) URL, got {url!r}", file=sys.stderr)
        return 2
    kinds = {k.strip() for k in os.environ.get("ALERT_KINDS", ",".join(FAULT_KINDS)).split(",") if k.strip()}
    try:
        timeout_s = float(os.environ.get("ALERT_TIMEOUT_S", "5"))
    except ValueError:
        timeout_s = -1.0
    if not 0 < timeout_s <= 60:
        print(f"alert_webhook: ALERT_TIMEOUT_S must be in (0, 60], got {os.environ['ALERT_TIMEOUT_S']!r}",
              file=sys.stderr)
        return 2
    try:
        record = json.loads(sys.stdin.read(1 << 20))
        if not isinstance(record, dict) or "kind" not in record:
            raise ValueError("not a scout report")
    except ValueError as error:
        print(f"alert_webhook: standard input is not a scout report: {error}", file=sys.stderr)
        return 2
    if record["kind"] not in kinds:
        return 0
    body = json.dumps({"text": message(record)}).encode("utf-8")
    request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as answer:
            answer.read(1 << 16)
    except (urllib.error.URLError, OSError) as error:
        print(f"alert_webhook: posting the {record['kind']} report failed: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
