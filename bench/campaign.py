"""The full fault campaign (``scout campaign``) as a benchmark: >= 1000 seeded simulated scenarios
over every simulated fault kind at 8-4096 ranks, every real-process fault kind on every rank of a
4-rank gloo job at two steps, and healthy runs with jitter. Writes bench/results/campaign.json
(the campaign's JSON, schema ``scout.campaign/1``, plus its goals: 100 % localized,
0 false attributions, >= 1000 simulated scenarios; docs/campaign.md) and prints the table.

    ./dev bench                       # every benchmark, this one included (about 15 minutes)
    python bench/campaign.py --quick  # the CI matrix only
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results" / "campaign.json"
GOALS = {"localized_fraction": 1.0, "false_attributions": 0, "sim_scenarios": 1000}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="the CI matrix instead of the full one")
    parser.add_argument("--seed", type=int, default=0)
    args, _unknown = parser.parse_known_args()  # ./dev bench passes its arguments to every benchmark

    from scout.scenarios import campaign

    result = campaign.CampaignResult(quick=args.quick, seed=args.seed)
    started = time.monotonic()

    def log(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    campaign.run_campaign(result, campaign.PARTS, log)  # as scout campaign runs it: every part
    result.wall_s = time.monotonic() - started
    document = result.to_json()
    totals = document["totals"]
    met = (totals["localized_fraction"] >= GOALS["localized_fraction"]
           and totals["false_attributions"] <= GOALS["false_attributions"]
           and (args.quick or totals["sim_scenarios"] >= GOALS["sim_scenarios"]))
    document.update({"benchmark": "campaign", "python": sys.version.split()[0], "machine": platform.machine(),
                     "goals": GOALS, "goals_met": met})
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(document, indent=1) + "\n")
    print(campaign.render(result))
    print(f"goals met: {met} -> {RESULTS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
