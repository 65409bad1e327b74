"""What a pull brings home is bounded, and this machine's full disk never costs the results
(issue 22, items 4 and 6 of the findings).

A full output disk used to fail the final pull (`rsync: write failed ... No space left on
device`), destroy the instance with the only copy of the checkpoints, and suggest `--resume`
with nothing to resume from; a 2 GB sparse file (0 bytes on the instance) arrived dense. The
free space of this machine's disk is played by :class:`FakeDisk` (a real full disk is a mount
only root can make); the pulls themselves are real rsync runs.
"""

from __future__ import annotations

import os
import shutil
import sys
import types
from pathlib import Path

import pytest
import yaml

import lorapod.compute.pulls as pulls
from lorapod.compute.jobs import down_job, pull_job
from lorapod.compute.local import LocalProvider
from lorapod.compute.pulls import RESERVE_BYTES, LocalDiskFull
from lorapod.compute.session import run_remote
from lorapod.compute.ssh import SSHProvider
from lorapod.spec import load_spec
from lorapod.store.ledger import Ledger

from .conftest_ssh import require_tools
from .remote_helpers import FAKE_TRAINER, fast_options, make_spec

#: the stand-in trainer, then a result bigger than the fake disk's free space (samples/big.bin)
#: and a sparse file of holes (run/holes.bin): neither is something a trainer writes
JOB = r"""
import os, runpy, sys
run = sys.argv[sys.argv.index("--run-dir") + 1]
big, holes = int(sys.argv[1]), int(sys.argv[2])
sys.argv = sys.argv[3:]
os.makedirs(os.path.join(run, "samples"), exist_ok=True)
if big:  # written before training: every pull sees it
    with open(os.path.join(run, "samples", "big.bin"), "wb") as fh:
        fh.write(os.urandom(big))
if holes:
    with open(os.path.join(run, "holes.bin"), "wb") as fh:
        fh.truncate(holes)
runpy.run_path(sys.argv[0], run_name="__main__")
"""


class FakeDisk:
    """shutil.disk_usage of this machine's disk, with as many bytes free as the test says."""

    def __init__(self, free: int) -> None:
        self.free = free

    def disk_usage(self, path):
        return shutil.disk_usage(path)._replace(free=self.free)


@pytest.fixture
def disk(monkeypatch) -> FakeDisk:
    fake = FakeDisk(10**15)
    monkeypatch.setattr(pulls, "shutil", types.SimpleNamespace(disk_usage=fake.disk_usage))
    return fake


def job_command(tmp_path: Path, big: int = 0, holes: int = 0):
    script = tmp_path / "job.py"
    script.write_text(JOB)
    return lambda py, spec, run, resume: [py, str(script), str(big), str(holes), str(FAKE_TRAINER), spec, "--run-dir", run,
                                          "--step-s", "0.02", *(["--resume"] if resume else [])]


def test_a_full_disk_here_gets_the_newest_checkpoint_first_and_waits_for_space(tmp_path, disk, monkeypatch):
    require_tools("rsync")
    disk.free = RESERVE_BYTES + (1 << 20)  # room for checkpoints and the adapter, not for 3 MB of samples
    lines: list[str] = []

    def say(msg: str) -> None:
        lines.append(msg)
        if msg.startswith("the newest checkpoint and the adapter are home"):
            disk.free = 10**15  # the user freed space

    spec = make_spec(tmp_path)
    summary = run_remote(load_spec(spec), LocalProvider(home=tmp_path / "machine"), "local",
                         fast_options(job_command=job_command(tmp_path, big=3 << 20), disk_full_retry_s=0.2,
                                      disk_full_grace_s=30), Ledger(), str(spec), say=say)
    assert summary.state == "done", summary.message
    said = " ".join(lines)
    assert "this machine's disk is full" in said and "free at least" in said, lines
    assert "space was freed: everything is pulled" in said
    assert (summary.run_dir / "samples" / "big.bin").stat().st_size == 3 << 20
    assert (summary.run_dir / "checkpoints" / "step-8").is_dir() and (summary.run_dir / "adapter").is_dir()


def test_on_an_ssh_host_the_results_stay_until_they_are_home(sshd, tmp_path, disk, monkeypatch):
    """The disk here never frees: the run fails saying so, the host keeps the work folder (its
    watchdog too), and `lorapod pull` brings everything once there is space."""
    disk.free = RESERVE_BYTES + (1 << 20)
    lines: list[str] = []
    spec = make_spec(tmp_path)
    with pytest.raises(LocalDiskFull, match="disk is full"):
        run_remote(load_spec(spec), SSHProvider(sshd.target, identity=sshd.client_key), sshd.target,
                   fast_options(identity=sshd.client_key, job_command=job_command(tmp_path, big=3 << 20), disk_full_retry_s=0.2,
                                disk_full_grace_s=1.5, watchdog={"poll_s": 0.2, "heartbeat_timeout_s": 1,
                                                                 "done_grace_s": 1}),
                   Ledger(), str(spec), say=lines.append)
    (job,) = Ledger().jobs()
    assert "no checkpoint" not in job.summary  # the newest checkpoint did come home
    assert any(f"the results stay on {sshd.target}" in x for x in lines), lines
    kept = sshd.work_root / job.id
    import time

    time.sleep(3)  # the watchdog's grace and silent-controller rules have passed: it leaves the folder
    assert (kept / "run" / "samples" / "big.bin").is_file() and (kept / "KEEP").is_file()
    assert "the work folder stays" in (kept / "watchdog.log").read_text()
    run_dir = Path(job.run_dir)
    assert (run_dir / "checkpoints" / "step-8").is_dir() and not (run_dir / "samples" / "big.bin").exists()
    ledger = Ledger()
    disk.free = 10**15
    assert pull_job(ledger, job.id) > 0 and (run_dir / "samples" / "big.bin").stat().st_size == 3 << 20
    assert down_job(ledger, job.id, say=lambda m: None) == 1
    assert not kept.exists() and Ledger().instances(live_only=True) == []


def test_a_sparse_file_stays_on_the_instance(tmp_path, monkeypatch):
    require_tools("rsync")
    lines: list[str] = []
    spec = make_spec(tmp_path)
    summary = run_remote(load_spec(spec), LocalProvider(home=tmp_path / "machine"), "local",
                         fast_options(job_command=job_command(tmp_path, holes=1 << 30)),  # 1 GiB of holes
                         Ledger(), str(spec), say=lines.append)
    assert summary.state == "done", summary.message
    assert not (summary.run_dir / "holes.bin").exists()
    assert any("left 1 sparse file(s) on the instance" in x and "holes.bin" in x for x in lines), lines


def test_the_pull_cap_from_the_spec_brings_only_the_newest_checkpoint_and_the_adapter(tmp_path, monkeypatch):
    require_tools("rsync")
    spec = make_spec(tmp_path, every=2)
    data = yaml.safe_load(spec.read_text())
    data["output"]["max_pull_gb"] = 0.001  # 1 MB: less than the samples
    spec.write_text(yaml.safe_dump(data))
    lines: list[str] = []
    summary = run_remote(load_spec(spec), LocalProvider(home=tmp_path / "machine"), "local",
                         fast_options(job_command=job_command(tmp_path, big=2 << 20)), Ledger(), str(spec),
                         say=lines.append)
    assert summary.state == "done", summary.message
    assert sorted(p.name for p in (summary.run_dir / "checkpoints").iterdir()) == ["step-8"]
    assert (summary.run_dir / "adapter").is_dir() and not (summary.run_dir / "samples" / "big.bin").exists()
    assert any("pass the pull cap of" in x for x in lines), lines


def test_the_cap_defaults_to_a_margin_over_the_planners_estimate():
    spec = types.SimpleNamespace(output=types.SimpleNamespace(max_pull_gb=None))
    assert pulls.cap_bytes(spec, 0.5) == int((10 * 0.5 + 2) * 1e9)
    assert pulls.cap_bytes(spec, None) is None
    spec.output.max_pull_gb = 3
    assert pulls.cap_bytes(spec, 0.5) == 3 * 10**9


def test_rsync_running_out_of_space_here_says_it_is_this_machines_disk(tmp_path):
    """A real full disk (a 2 MB tmpfs in a mount namespace of its own) under a pull whose free
    space check was passed: rsync's `No space left on device` becomes LocalDiskFull."""
    import subprocess

    require_tools("rsync")
    if subprocess.run(["unshare", "-rm", "true"], capture_output=True).returncode != 0:
        pytest.skip("no user+mount namespaces here")
    src = tmp_path / "machine" / "w" / "run"
    (src / "samples").mkdir(parents=True)
    (src / "samples" / "big.bin").write_bytes(b"\1" * (4 << 20))
    dest = tmp_path / "full"
    dest.mkdir()
    code = f"""
import json, shutil, types, sys
import lorapod.compute.pulls as pulls
from lorapod.compute.transport import LocalTransport
pulls.shutil = types.SimpleNamespace(disk_usage=lambda p: shutil.disk_usage(p)._replace(free=10**15))
class Work:
    transport, dir = LocalTransport(pulls.Path({str(tmp_path / "machine")!r})), "w"
    def sh(self, script, input=None, timeout=60):
        import subprocess
        return subprocess.run([sys.executable, "-", {str(src)!r}], input=input, capture_output=True)
    def q(self, rel):
        return rel
try:
    pulls.PullGuard(Work(), pulls.Path({str(dest)!r}), sys.executable, None, print).pull("final")
except pulls.LocalDiskFull as exc:
    print("LOCAL-DISK-FULL", exc.message)
"""
    script = 'mount -t tmpfs -o size=2m tmpfs "$0" && exec "$@"'
    out = subprocess.run(["unshare", "-rm", "sh", "-c", script, str(dest), sys.executable, "-c", code],
                         capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[1] / "src")})
    assert "LOCAL-DISK-FULL this machine's disk is full" in out.stdout, out.stdout + out.stderr


def test_on_a_billing_instance_the_grace_is_bounded_then_it_is_destroyed(sshd_factory, remote_root, tmp_path, disk):
    """RunPod, and this machine's disk never frees: the newest checkpoint and the adapter come
    home first, the pod is kept for the grace period only (never past the caps), then destroyed
    with confirmation; the summary says what is home."""
    import time

    from lorapod.errors import LorapodError

    from .fakes.runpod_fake import RunPodFake
    from .test_compute_session_faults import assert_nothing_bills, provider

    fake = RunPodFake(sshd_factory, remote_root)
    try:
        disk.free = RESERVE_BYTES + (1 << 20)
        spec = make_spec(tmp_path)
        lines: list[str] = []
        t0 = time.monotonic()
        with pytest.raises(LorapodError, match=r"this machine's disk is full"):
            run_remote(load_spec(spec), provider(fake), "runpod",
                       fast_options(job_command=job_command(tmp_path, big=3 << 20), disk_full_retry_s=0.2,
                                    disk_full_grace_s=2.0), Ledger(), str(spec), say=lines.append)
        assert time.monotonic() - t0 < 60
        said = " ".join(lines)
        assert "keeps the instance for up to 2 s (within the caps)" in said, lines
        assert "the newest checkpoint and the adapter are home" in said
        (job,) = Ledger().jobs()
        run_dir = Path(job.run_dir)
        assert (run_dir / "checkpoints" / "step-8").is_dir() and (run_dir / "adapter").is_dir()
        assert "resume with `lorapod run --resume" in job.summary
        assert_nothing_bills(fake, Ledger())
    finally:
        fake.close()


def test_a_checkpoint_rotated_away_mid_pull_is_a_warning_not_a_failed_pull():
    """rsync exits 24 when a listed source file vanished before it was sent (rsync(1), EXIT VALUES):
    the job's keep_last removed an old checkpoint during a progress pull. That failed the whole run
    before; other non-zero exits still fail."""
    import sys

    import pytest

    from lorapod.compute.transport import _run_rsync
    from lorapod.errors import RemoteError

    vanished = [sys.executable, "-c", "import sys; print('Number of regular files transferred: 3'); "
                "sys.stderr.write('file has vanished: \"run/checkpoints/step-1/state.json\"'); sys.exit(24)"]
    assert _run_rsync(vanished, 10, "download of run").files_transferred == 3
    other = [sys.executable, "-c", "import sys; sys.stderr.write('protocol data stream error'); sys.exit(12)"]
    with pytest.raises(RemoteError, match="rsync exit 12"):
        _run_rsync(other, 10, "download of run")
