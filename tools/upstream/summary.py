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
    print(f"{'case':<12} {'trainer':<13} {'launch':<16} {'wall s':>7} {'peak GB':>8}  result")
    total = built = 0
    for r in rows:
        for name, ph in r["phases"].items():
            if name.startswith("build "):  # the random-weight model, built once (kept between runs)
                built += ph["seconds"]
            else:
                total += ph["seconds"]
            print(f"{r['case']:<12} {r['trainer']:<13} {name:<16} {ph['seconds']:>7} {ph['peak_rss_mb'] / 1024:>8.1f}  "
                  + ("ok" if r["ok"] else "; ".join(r["problems"])))
    print(f"{len(rows)} case(s): {total} s of training launches, {built} s building models "
          "(virtualenvs and checkouts not counted)")
    return 0 if rows and all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
