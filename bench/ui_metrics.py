"""Benchmark: the dashboard's chart data (``GET /runs/JOB/metrics``) for a large metrics.jsonl.

    PYTHONPATH=src python bench/ui_metrics.py [--mb 100] [--dir /tmp/lorapod-bench-ui]

A run folder with a metrics.jsonl of ``--mb`` MB (lines as the engine writes them, one per step)
is made once and reused; the request is sent three times through the dashboard's ASGI app
(Starlette's TestClient, token and all). Prints the wall time of each request, the peak of
Python's allocations during the requests (tracemalloc) and the process's peak RSS growth.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))


def make_run(root: Path, mb: int) -> Path:
    run = root / "big-run"
    metrics = run / "metrics.jsonl"
    if metrics.is_file() and metrics.stat().st_size >= mb * 1024 * 1024:
        return run
    (run / "checkpoints").mkdir(parents=True, exist_ok=True)
    (run / "spec.yaml").write_text("model: {id: lorapod:tiny-llm}\ntrain: {max_steps: 10000000}\n")
    with open(metrics, "w") as fh:
        step, t0 = 0, time.time() - 86400
        while fh.tell() < mb * 1024 * 1024:
            step += 1
            fh.write(json.dumps({"time": t0 + step, "step": step, "epoch": step // 1000, "loss": 1.0 / step ** 0.3,
                                 "lr": 1e-4, "grad_norm": 0.5, "step_time_s": 0.25, "tokens_per_s": 4000.0,
                                 "mem_gb": 10.5}) + "\n")
    return run


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=int, default=100)
    ap.add_argument("--dir", type=Path, default=Path("/tmp/lorapod-bench-ui"))
    args = ap.parse_args()
    from starlette.testclient import TestClient

    from lorapod.ui.app import Dashboard, build_app
    from lorapod.ui.guard import cookie_name
    from lorapod.ui.runs import RunIndex

    run = make_run(args.dir, args.mb)
    client = TestClient(build_app(Dashboard(RunIndex([args.dir]), "t"), {"testserver"}, 0))
    client.cookies.set(cookie_name(0), "t")
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    tracemalloc.start()
    times = []
    for _ in range(3):
        t = time.perf_counter()
        got = client.get(f"/runs/{run.name}/metrics").json()
        times.append(time.perf_counter() - t)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0
    size = (run / "metrics.jsonl").stat().st_size / 1048576
    print("| metrics.jsonl | request (3 runs) | peak Python allocations | peak RSS growth | lines read | sampled |")
    print("|---|---|---|---|---|---|")
    print(f"| {size:.0f} MB | {' / '.join(f'{t:.2f} s' for t in times)} | {peak / 1e6:.0f} MB | {rss / 1024:.0f} MB "
          f"| {got['rows']:,} | {got.get('sampled', '-')} |")


if __name__ == "__main__":
    main()
