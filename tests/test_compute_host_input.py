"""What a host sends is bounded and validated: forged metrics never end a healthy run (issue 22, item 1).

Over the real loopback sshd (tests/conftest_ssh.py): a job writes forged and broken lines into
run/metrics.jsonl between good ones; the controller drops and counts them, the run ends `done`,
the ledger keeps a sane last step, and no poll ever reads more than POLL_BYTES.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from lorapod.compute.remote import RemoteWork
from lorapod.compute.session import run_remote
from lorapod.compute.ssh import SSHProvider
from lorapod.rundir.metrics import MAX_LINE_BYTES, POLL_BYTES, MetricsFeed, shown_number
from lorapod.spec import load_spec
from lorapod.store.ledger import Ledger

from .remote_helpers import fast_options, make_spec

FORGER = r"""
import json, sys, pathlib
run = pathlib.Path(sys.argv[1])
run.mkdir(parents=True, exist_ok=True)
with open(run / "metrics.jsonl", "a") as fh:
    fh.write(json.dumps({"step": 1, "loss": 2.0}) + "\n")
    fh.write('{"step": ' + str(10**26) + ', "loss": 1.0}\n')         # beyond SQLite's INTEGER
    fh.write(json.dumps({"step": 2, "loss": -1e308}) + "\n")          # 300 digits if printed
    fh.write(json.dumps({"step": -5, "loss": 1.0}) + "\n")            # negative
    fh.write(json.dumps({"step": True, "loss": 1.0}) + "\n")          # a bool is not a step
    fh.write('{"step": 3, "loss": ' + "9" * 400 + '}\n')               # an integer loss of 400 digits
    fh.write("[1, 2, 3]\n" + "not json\n")
    fh.write('{"step": 4, "pad": "' + "x" * (3 << 20) + '"}\n')        # a 3 MB line
    fh.write(json.dumps({"step": 1, "loss": 1.0}) + "\n")             # going backwards
    fh.write(json.dumps({"step": 5, "loss": 0.5}) + "\n")
(run / "adapter").mkdir(exist_ok=True)
(run / "adapter" / "adapter_config.json").write_text("{}")
"""


def test_forged_metrics_lines_are_dropped_and_counted_never_fatal(sshd, tmp_path, monkeypatch):
    job = tmp_path / "forger.py"
    job.write_text(FORGER)
    seen: list[int] = []
    real_poll = RemoteWork.poll

    def poll(self, offset, **kw):
        st = real_poll(self, offset, **kw)
        seen.append(len(st.metrics))
        return st

    monkeypatch.setattr(RemoteWork, "poll", poll)
    spec = make_spec(tmp_path)
    lines: list[str] = []
    ledger = Ledger()
    summary = run_remote(load_spec(spec), SSHProvider(sshd.target, identity=sshd.client_key), sshd.target,
                         fast_options(identity=sshd.client_key,
                                      job_command=lambda py, s, run, resume: [py, str(job), run]),
                         ledger, str(spec), say=lines.append)
    assert summary.state == "done", summary.message
    assert summary.last_step == 5 and ledger.job(summary.job_id).last_step == 5
    shown = [x.split("  $")[0] for x in lines if x.startswith("step ")]  # less the spend (engine/progress.py)
    assert shown == ["step 1  loss 2.0000", "step 2", "step 3", "step 5  loss 0.5000"], shown
    assert "7 metrics line(s) from the instance ignored" in summary.message
    assert any("ignored" in x and "line longer than 64 KiB" in x for x in lines), lines
    assert max(seen) <= POLL_BYTES  # every poll is a bounded read, whatever the file holds
    assert ledger.instances(live_only=True) == []


def test_feed_skips_an_endless_line_in_bounded_chunks():
    feed = MetricsFeed()
    chunk = b"x" * POLL_BYTES
    for _ in range(100):  # 100 MiB of one line, a chunk per poll: nothing is kept
        records, full = feed.take(chunk)
        assert records == [] and full
    records, full = feed.take(b"xxx\n" + json.dumps({"step": 7}).encode() + b"\n")
    assert [r["step"] for r in records] == [7] and not full
    assert feed.dropped["line longer than 64 KiB"] == 1
    assert feed.offset == 100 * POLL_BYTES + 4 + len(json.dumps({"step": 7})) + 1


def test_feed_waits_for_a_partial_line_and_reads_it_whole_later():
    feed = MetricsFeed()
    line = json.dumps({"step": 3, "loss": 1.5}).encode()
    assert feed.take(line[:5]) == ([], False) and feed.offset == 0
    records, _ = feed.take(line + b"\n")
    assert records == [{"step": 3, "loss": 1.5}] and feed.offset == len(line) + 1
    assert feed.take(b"y" * (MAX_LINE_BYTES + 1))[0] == [] and feed.dropped_total == 1


def test_shown_number_refuses_what_would_flood_the_terminal():
    assert shown_number(0.25) == "0.2500"
    assert shown_number(-1e308) is None and shown_number(float("nan")) is None
    assert shown_number(10**400) is None and shown_number("inf") is None and shown_number(True) is None


def test_resumed_feed_accepts_the_restart_at_its_checkpoint(tmp_path):
    from lorapod.compute.session import _end_of_last_line

    p = Path(tmp_path / "m.jsonl")
    p.write_bytes(b'{"step": 1}\n' * 50000 + b'{"step": 2')
    assert _end_of_last_line(p) == len(b'{"step": 1}\n') * 50000
    p.write_bytes(b"no newline at all")
    assert _end_of_last_line(p) == 0


BANNER_PYTHON = """#!/bin/sh
echo "Welcome to this image: CUDA 12.8, conda base"
exec {python} "$@"
"""


def test_an_instance_python_that_prints_a_banner_still_runs_the_job(sshd, tmp_path):
    """Issue 22 item 8: the probe read only stderr and the first stdout line, so a banner on
    stdout refused the instance with an empty reason (`does not start ... python3: `)."""
    from lorapod.compute.remote import Bootstrap

    from .remote_helpers import fake_command

    wrapper = tmp_path / "python-with-banner"
    wrapper.write_text(BANNER_PYTHON.format(python=sys.executable))
    wrapper.chmod(0o755)
    spec = make_spec(tmp_path)
    summary = run_remote(load_spec(spec), SSHProvider(sshd.target, identity=sshd.client_key), sshd.target,
                         fast_options(identity=sshd.client_key, job_command=fake_command(0.02),
                                      bootstrap=Bootstrap("source", python=str(wrapper), deps="none")),
                         Ledger(), str(spec), say=lambda m: None)
    assert summary.state == "done", summary.message


def test_an_instance_python_that_fails_is_refused_with_what_it_said(sshd, tmp_path):
    from lorapod.compute.remote import Bootstrap
    from lorapod.errors import RemoteError

    from .remote_helpers import fake_command

    wrapper = tmp_path / "broken-python"
    wrapper.write_text(f"#!/bin/sh\ncase \"$1\" in watchdog.py) exec {sys.executable} \"$@\";; esac\n"
                       "echo 'Welcome banner'\nexit 3\n")
    wrapper.chmod(0o755)
    spec = make_spec(tmp_path)
    with pytest.raises(RemoteError, match="cannot run lorapod") as exc:  # the probe's refusal (compute/hostfacts.py)
        run_remote(load_spec(spec), SSHProvider(sshd.target, identity=sshd.client_key), sshd.target,
                   fast_options(identity=sshd.client_key, job_command=fake_command(0.02),
                                bootstrap=Bootstrap("source", python=str(wrapper), deps="none")),
                   Ledger(), str(spec), say=lambda m: None)
    assert "does not run; it said: Welcome banner" in exc.value.message
