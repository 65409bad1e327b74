"""One reader of metrics.jsonl for every consumer (issue 34 item 3): the same hostile file read by
the dashboard, the planner's measured runs, ``lorapod logs``, the engine, export's model card and
the controller's feed gives the same records, and none of them fails on it.

Before, the dashboard kept ``{"step": -5}`` and ``{"step": 10**26}``, the planner raised on a
string step or a string step time, and ``lorapod logs`` printed the forged steps."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from lorapod.rundir import METRICS, read_records
from lorapod.rundir.metrics import MAX_LINE_BYTES, MetricsFeed, read_bytes
from lorapod.store.ledger import Ledger

from .cli_helpers import run_cli

EXAMPLE = Path(__file__).parents[1] / "examples" / "sdxl-object-lora.yaml"

GOOD = [{"step": s, "loss": round(1.0 / s, 4), "step_time_s": 0.5, "mem_gb": 3.0, "time": 1.7e9 + s} for s in range(1, 9)]
HOSTILE = [
    b'{"step": 100000000000000000000000000, "loss": 1}',  # beyond any SQLite integer
    b'{"step": -5, "loss": 1}',
    b'{"step": "7", "step_time_s": "abc", "mem_gb": "lots"}',
    b'{"step": true, "loss": 1}',
    b"[1, 2, 3]",
    b"[" * 30000 + b"]" * 30000,  # JSON nesting: RecursionError in json.loads
    b'{"step": 3.5}',
    b'{"loss": 0.1}',
    b'{"step": 9, "pad": "' + b"a" * (MAX_LINE_BYTES + 10) + b'"}',  # valid, but longer than a line may be
    b"not json at all",
    b"\xff\xfe\x00 bytes",
]
#: a valid step with hostile values: kept by the reader, so every consumer must bear its values
ODD_VALUES = {"step": 8, "step_time_s": "fast", "mem_gb": "lots", "loss": "nan"}


def hostile_run(parent: Path) -> Path:
    root = parent / "hostile-20261202-120000-ab12"
    (root / "checkpoints").mkdir(parents=True)
    shutil.copy(EXAMPLE, root / "spec.yaml")
    lines = []
    for i, rec in enumerate(GOOD):
        lines.append(json.dumps(rec).encode())
        lines.append(HOSTILE[i % len(HOSTILE)])
    lines += [*HOSTILE[len(GOOD):], json.dumps(ODD_VALUES).encode()]
    (root / METRICS).write_bytes(b"\n".join(lines) + b"\n")
    return root


def test_the_reader_keeps_only_valid_steps_and_counts_the_rest(tmp_path):
    root = hostile_run(tmp_path)
    feed = MetricsFeed()
    records = read_records(root / METRICS, feed=feed)
    assert [r["step"] for r in records] == [*range(1, 9), 8]
    assert feed.dropped_total == len(HOSTILE)
    # the controller's poll and the whole-file read are one policy
    polled, _ = MetricsFeed().take(read_bytes(root / METRICS), limit=1 << 30)
    assert polled == records
    # bounded: the last bytes only, from their first whole line
    assert [r["step"] for r in read_records(root / METRICS, tail_bytes=200)] == [8]


def test_a_link_or_a_fifo_is_never_read(tmp_path):
    import os

    root = hostile_run(tmp_path)
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / METRICS).symlink_to(root / METRICS)
    assert read_records(tmp_path / "elsewhere" / METRICS) == []
    os.mkfifo(tmp_path / "fifo")  # an open for reading would wait for a writer for ever
    assert read_records(tmp_path / "fifo") == []


def test_every_consumer_reads_the_same_hostile_file_the_same_way(tmp_path, capsys):
    from lorapod.engine.metrics import read_metrics
    from lorapod.export.card import read_metrics_file
    from lorapod.plan.learned import WARMUP_STEPS, read_run
    from lorapod.ui.app import Dashboard, build_app
    from lorapod.ui.guard import cookie_name
    from lorapod.ui.runs import RunIndex
    from lorapod.ui.runs import read_metrics as ui_read_metrics

    root = hostile_run(tmp_path)
    want = read_records(root / METRICS)
    # the engine, export's card and the dashboard's own bounded read
    assert read_metrics(root / METRICS) == want and read_metrics_file(root / METRICS) == want
    assert ui_read_metrics(root) == want
    # the dashboard's chart (bounded sampling, then the same reader) and pages
    client = TestClient(build_app(Dashboard(RunIndex([tmp_path]), "t"), {"testserver"}, 0))
    client.cookies.set(cookie_name(0), "t")
    chart = client.get(f"/runs/{root.name}/metrics").json()
    assert chart["rows"] == len(want) and chart["last_step"] == 8
    assert client.get("/").status_code == 200 and client.get(f"/runs/{root.name}").status_code == 200
    # the planner's measured run: only numeric step times after the warm-up count
    got = read_run(root)
    assert got is not None and got[-1] == len([r for r in GOOD if r["step"] > WARMUP_STEPS])
    # `lorapod logs JOB` on the pulled copy: one progress line per record the reader keeps
    Ledger().job_started(root.name, str(root), "runpod", "runpod", None, None, None)
    code, out, err = run_cli(["logs", root.name], capsys)
    assert code == 0, err
    shown = [line for line in out.splitlines() if line.startswith("[metrics] ")]
    assert len(shown) == len(want), out
    assert "-5" not in "".join(shown) and "100000000000" not in "".join(shown)


@pytest.mark.parametrize("line", HOSTILE)
def test_each_hostile_line_is_dropped_by_every_entry(line):
    feed = MetricsFeed()
    assert feed.accept(line) is None and feed.dropped_total == 1
    assert read_records_of(line) == []


def read_records_of(data: bytes) -> list:
    from lorapod.rundir.metrics import parse_records

    return parse_records(data)


def test_a_forged_step_past_the_jobs_length_never_hides_the_real_lines_after_it(tmp_path):
    """A host's ``step: 10**12`` inside 0..MAX_STEP: with the job's length as the ceiling it is
    dropped without moving the floor; a resume's cut keeps every real line up to the checkpoint."""
    from lorapod.rundir.metrics import cut_after

    lines = [{"step": 1, "loss": 1.0}, {"step": 10**12, "loss": 0.5}, {"step": 2, "loss": 0.9},
             {"step": 3, "loss": 0.8}, {"step": 4, "loss": 0.7}]
    data = "".join(json.dumps(r) + "\n" for r in lines).encode()
    feed = MetricsFeed(ceiling=12)
    records, _ = feed.take(data)
    assert [r["step"] for r in records] == [1, 2, 3, 4] and feed.dropped["step past the job's length"] == 1
    assert [r["step"] for r in MetricsFeed().take(data)[0]] == [1, 10**12]  # no ceiling: the floor jumps
    path = tmp_path / METRICS
    path.write_bytes(data)
    cut_after(path, 3)
    assert [r["step"] for r in read_records(path)] == [1, 2, 3]
