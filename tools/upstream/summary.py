"""The real runs' times and peak memory as a table (what .ci/run prints after its trainer stage).

    python tools/upstream/summary.py SUMMARY.jsonl

SUMMARY.jsonl is what tools/upstream/real_run.py ``--summary`` appends, one line per case: each
launch's wall time and peak RSS, and the model build's where the case built its model.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main() -> int:
    rows = [json.loads(x) for x in Path(sys.argv[1]).read_text().splitlines() if x.strip()]
    print("| case | trainer | phase | wall s | peak RSS GB | model on disk GB | result |")
    print("|---|---|---|---:|---:|---:|---|")
    total = built = 0
    for r in rows:
        for name, ph in r["phases"].items():
            if name.startswith("build "):  # the random-weight model (deleted after its last case in CI)
                built += ph["seconds"]
            else:
                total += ph["seconds"]
            result = "ok" if r["ok"] else "; ".join(r["problems"])
            print(f"| {r['case']} | {r['trainer']} | {name} | {ph['seconds']} | {ph['peak_rss_mb'] / 1024:.1f} | "
                  f"{r.get('model_gb', '')} | {result} |")
    print(f"\n{len(rows)} case(s): {total} s of training launches, {built} s building models "
          "(virtualenvs and checkouts not counted)")
    return 0 if rows and all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
