"""compute/watchdog.py: the rules by which the watchdog waits, stops, kills or destroys."""

from __future__ import annotations

import pytest

from lorapod.compute.watchdog import DEFAULTS, cap_seconds, decide


def facts(**kw):
    base = {"job_started": True, "job_done": False, "done_at": None, "pulled": False, "heartbeat": None,
            "progress": None, "stop_written_at": None}
    base.update(kw)
    return base


CFG = {**DEFAULTS, "heartbeat_timeout_s": 60, "done_grace_s": 600, "stall_s": 300, "stop_wait_s": 30,
       "cap_margin_s": 20}


@pytest.mark.parametrize(("cfg", "now", "f", "action"), [
    ({}, 100, facts(job_done=True, done_at=90, pulled=True, heartbeat=99), "destroy"),  # pulled: go now
    ({}, 100, facts(job_done=True, done_at=90, heartbeat=99), "wait"),  # done, controller pulling
    ({}, 200, facts(job_done=True, done_at=90, heartbeat=100), "destroy"),  # done, controller silent 100 s
    ({}, 800, facts(job_done=True, done_at=100, heartbeat=799), "destroy"),  # done, grace over
    ({}, 100, facts(progress=90, heartbeat=5), "wait"),  # running: a silent controller alone is no reason
    ({}, 400, facts(progress=50, heartbeat=399), "stop"),  # stalled 350 s: checkpoint and stop
    ({}, 400, facts(progress=50, stop_written_at=350), "kill"),  # STOP ignored for 50 s
    ({"max_hours": 0.1, "elapsed_at_start_s": 0}, 345, facts(progress=344), "stop"),  # cap (360 s) in 15 s
    ({"max_hours": 0.1, "elapsed_at_start_s": 0}, 361, facts(progress=360, stop_written_at=345), "destroy"),
    ({"max_usd": 1.0, "usd_per_hour": 36.0, "elapsed_at_start_s": 50}, 51, facts(progress=50), "destroy"),
    ({}, 100, facts(job_started=False, heartbeat=90), "wait"),
    ({}, 100, facts(job_started=False, heartbeat=10), "destroy"),  # never started, controller gone
])
def test_watchdog_decisions(cfg, now, f, action):
    assert decide({**CFG, **cfg}, now, 0.0, f) == action


def test_cap_seconds_takes_the_tighter_cap():
    assert cap_seconds({"max_hours": 2, "max_usd": 1, "usd_per_hour": 1.0}) == 3600
    assert cap_seconds({"max_hours": None, "max_usd": None}) is None
