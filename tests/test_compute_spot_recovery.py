"""A job on spot survives its preemptions: the RunPod and Vast.ai fakes take the instance back
as the providers do (tests/fakes cite them), the controller tells that from a crash or a lost
connection, gives the husk back, resumes on the next instance from the newest whole checkpoint,
and ends with the adapter and losses of an uninterrupted run, under the one cap, nothing billing.

The trainer is the stand-in (tests/fake_trainer.py) with ``--chain``: a state carried from step to
step and through its checkpoints, so a resume from the wrong place, a cut-off checkpoint or a
step counted twice changes the losses and the adapter."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from lorapod.compute.context import Claim, JobContext
from lorapod.compute.provider import Instance, Offer
from lorapod.compute.pulls import PullGuard
from lorapod.compute.recovery import Preempted, check_preempted, classify, next_tier, settle_run_folder
from lorapod.compute.session import run_remote
from lorapod.spec import load_spec
from lorapod.store.ledger import Ledger
from lorapod.store.preemptions import exposure, job_figures

from .fakes.runpod_fake import GPU_TYPES, RunPodFake
from .fakes.vast_fake import VastFake
from .remote_helpers import FAKE_TRAINER, fake_command, fast_options, make_spec
from .test_compute_spot import rp, va

STEPS, EVERY = 16, 2


def spot_options(**kw):
    step_s = kw.pop("step_s", 0.2)
    return fast_options(job_command=kw.pop("job_command", None) or fake_command(step_s, ("--chain", "--ckpt-mb", "2")),
                        spot=True, spot_policy="always", preempt_confirm_s=kw.pop("preempt_confirm_s", 3.0),
                        spot_resume_wait_s=1.5,
                        pull_every_s=0.3, **kw)


def uninterrupted(tmp_path: Path, spec_path: Path) -> tuple[dict[int, float], bytes]:
    """The same trainer, the same spec, run once through on this machine."""
    run = tmp_path / "uninterrupted"
    subprocess.run([sys.executable, str(FAKE_TRAINER), str(spec_path), "--run-dir", str(run), "--step-s", "0",
                    "--chain"], check=True, capture_output=True, timeout=60)
    return losses(run), (run / "adapter" / "adapter_model.safetensors").read_bytes()


def losses(run: Path) -> dict[int, float]:
    recs = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [r["step"] for r in recs if "loss" in r]
    assert steps == sorted(set(steps)), f"a step logged twice or out of order: {steps}"
    return {r["step"]: r["loss"] for r in recs if "loss" in r}


def newest_live(fake) -> str:
    return [i.id for i in fake.instances.values() if not i.deleted][-1]


def assert_nothing_bills(fake, ledger: Ledger, remote_root: Path) -> None:
    assert fake.live() == [], "an instance or a stopped / paused husk is still at the provider"
    assert fake.running_processes() == []
    assert ledger.instances(live_only=True) == []
    assert list(remote_root.iterdir()) == []
    assert fake.violations == [], fake.violations


# ----------------------------------------------------------------------------- the whole job

def test_runpod_job_preempted_three_times_ends_as_if_uninterrupted(runpod, tmp_path, remote_root, monkeypatch):
    """Preempted during setup (after the bootstrap, before the data), mid-step, and while pulling a
    checkpoint: each time the stopped pod is destroyed (confirmed), a new spot pod is rented, and
    the job resumes from the newest checkpoint that came home whole.

    Waits on conditions only (issue 48, F17: it failed on a loaded machine, where the trainer ran
    ahead of the controller): the stand-in holds after step 6 until the mid-run preemption is on its
    way, which comes once a whole checkpoint is home (so the resume has one to start from), and
    after step 12 until the mid-pull one is; and the controller may ask the provider for up to
    120 s whether a dead job's pod was taken back (it stops asking as soon as the provider says
    so), where 3 s let a slow "stopped" read as a crash."""
    spec_path = make_spec(tmp_path, max_steps=STEPS, every=EVERY)
    want_losses, want_adapter = uninterrupted(tmp_path, spec_path)
    moments: list[str] = []
    gates = {"mid-step": tmp_path / "gate-6", "mid-pull": tmp_path / "gate-12"}

    def preempt(why: str) -> None:
        moments.append(why)
        pod = newest_live(runpod)
        threading.Thread(target=runpod.preempt, args=(pod, 0.5), daemon=True).start()
        time.sleep(0.05)  # the SIGTERM is on its way before the controller goes on
        if why in gates:  # the job may go on: the next pod passes this step
            gates[why].write_text("open")

    def say(msg: str) -> None:
        if not moments and msg.startswith("bootstrapped"):
            preempt("setup")

    real_pull = PullGuard.pull

    def home() -> bool:  # a whole checkpoint came home (the rule the resume uses)
        from .fake_trainer import whole

        return any(whole(p) for p in tmp_path.glob("runs/*/checkpoints/step-*"))

    def pull(self, why, newest_only=False):
        if len(moments) == 2 and why == "progress" and _remote_steps(remote_root) >= 10:
            preempt("mid-pull")
        got = real_pull(self, why, newest_only=newest_only)
        if len(moments) == 1 and _remote_steps(remote_root) >= 4 and home():
            preempt("mid-step")  # the job is running (held after step 6 at the latest)
        return got

    monkeypatch.setattr(PullGuard, "pull", pull)
    ledger = Ledger()
    held = fake_command(0.2, ("--chain", "--ckpt-mb", "2", "--gate", f"6={gates['mid-step']}",
                              "--gate", f"12={gates['mid-pull']}"))
    summary = run_remote(load_spec(spec_path), rp(runpod), "runpod",
                         spot_options(max_usd=1.0, job_command=held, preempt_confirm_s=120.0), ledger,
                         str(spec_path), say=say)
    assert moments == ["setup", "mid-step", "mid-pull"], moments
    assert summary.state == "done", summary.message
    run = summary.run_dir
    assert losses(run) == want_losses  # every step once, each loss as uninterrupted
    assert (run / "adapter" / "adapter_model.safetensors").read_bytes() == want_adapter
    # four spot pods, the three husks destroyed, nothing billing; the cap never crossed
    assert len(runpod.instances) == 4 and all(p in runpod.spot for p in runpod.instances)
    assert_nothing_bills(runpod, ledger, remote_root)
    assert summary.usd <= 1.0 and summary.usd == pytest.approx(ledger.usd(summary.job_id))
    assert len(ledger.job_instances(summary.job_id)) == 4  # one meter: every instance in the job's dollars
    events = ledger.events(summary.job_id)
    pre = [json.loads(e["message"]) for e in events if e["kind"] == "preemption"]
    assert len(pre) == 3 and all(p["cost_usd"] >= 0 for p in pre)
    assert pre[0]["resume_step"] is None  # preempted before any checkpoint: started over
    assert pre[1]["resume_step"] is not None and pre[1]["resume_step"] <= pre[1]["step"]
    fig = job_figures(ledger, summary.job_id)
    assert fig.preemptions == 3 and summary.spot["preemptions"] == 3
    assert fig.saved_usd is not None  # against the on-demand RTX 3090 the fake lists
    assert "3 preemption(s)" in summary.message
    # measured for the planner: three preempted spot instances and the last one
    seen = exposure(ledger, "runpod", "RTX 3090", "spot")
    assert seen.instances == 4 and seen.preemptions == 3 and seen.hours > 0


def test_logs_follow_a_spot_job_onto_its_next_instance(runpod, tmp_path, remote_root, monkeypatch):
    """`lorapod logs -f` started mid-run follows the job through a preemption: it waits while the
    controller rents the next pod, says the move, and shows every step once, in order, ending
    with the job (compute/joblogs.py follow_logs)."""
    from lorapod.compute.joblogs import follow_logs

    # the follower reaches the pods as `lorapod logs` does: the provider from the ledger's row
    monkeypatch.setenv("RUNPOD_API_KEY", runpod.account_key)
    monkeypatch.setenv("LORAPOD_RUNPOD_URL", runpod.url)
    monkeypatch.setenv("LORAPOD_RUNPOD_GRAPHQL_URL", runpod.graphql_url)

    spec_path = make_spec(tmp_path, max_steps=12, every=EVERY)
    shown: list[str] = []
    follower: list[threading.Thread] = []
    preempted: list[str] = []

    def follow() -> None:
        ledger = Ledger()
        (job,) = ledger.jobs()
        shown.extend(follow_logs(ledger, job.id, follow=True, poll_s=0.1, reconnect_s=5))

    def say(msg: str) -> None:
        s = _step(msg) if msg.startswith("step ") else 0
        if s >= 2 and not follower:
            follower.append(threading.Thread(target=follow, daemon=True))
            follower[0].start()
        elif s >= 7 and not preempted:
            preempted.append(newest_live(runpod))
            threading.Thread(target=runpod.preempt, args=(preempted[0], 0.5), daemon=True).start()
            time.sleep(0.05)

    ledger = Ledger()
    summary = run_remote(load_spec(spec_path), rp(runpod), "runpod", spot_options(max_usd=1.0), ledger,
                         str(spec_path), say=say)
    assert summary.state == "done", summary.message
    follower[0].join(60)
    assert not follower[0].is_alive(), "the follower did not end with the job"
    steps = [json.loads(x.split("] ", 1)[1])["step"] for x in shown if x.startswith("[metrics.jsonl]")]
    assert steps == list(range(1, 13)), shown  # every step once, in order, across the move
    moves = [i for i, x in enumerate(shown) if x.startswith("[lorapod] the job moved to instance")]
    assert len(moves) == 1, shown
    (second,) = [p for p in runpod.instances if p != preempted[0]]
    assert second in shown[moves[0]]
    assert any(x == "[job.log] done" for x in shown[moves[0]:]), shown  # the new instance's own log
    assert_nothing_bills(runpod, ledger, remote_root)


def _step(msg: str) -> int:
    try:
        return int(msg.split()[1].split("/")[0])
    except (IndexError, ValueError):
        return 0


def _step_dir(p: Path) -> int:
    return int(p.name.split("-")[1])


def _remote_steps(remote_root: Path) -> int:
    steps = [_step_dir(p) for p in remote_root.glob("*/run/checkpoints/step-*")]
    return max(steps, default=0)


def test_vast_outbid_raises_the_bid_then_moves(sshd_factory, remote_root, tmp_path):
    """Outbid once, in the middle of a checkpoint's write, by a bid the ceiling can beat: the bid is
    raised, the paused instance resumes on its own disk (the cut-off checkpoint still on it) and
    the job goes on there from the newest whole one. Outbid again by a bid beyond the ceiling: after
    the bounded wait the husk is destroyed and the job moves to a new instance."""
    fake = VastFake(sshd_factory, remote_root, key_delay_s=0.0)
    try:
        spec_path = make_spec(tmp_path, max_steps=STEPS, every=EVERY, max_bid_per_gpu_hour=0.2, disk_gb=50)
        want_losses, want_adapter = uninterrupted(tmp_path, spec_path)
        moments: list[str] = []
        watching = threading.Event()

        def outbid(bid: float) -> None:
            threading.Thread(target=fake.outbid, args=(newest_live(fake), bid), daemon=True).start()

        def mid_write() -> None:
            """Outbid while a checkpoint past step 4 is half written (files there, no manifest)."""
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and not moments:
                for tmp in remote_root.glob("*/run/checkpoints/.tmp-step-*"):
                    if int(tmp.name.rsplit("-", 1)[1]) >= 4 and not (tmp / "manifest.json").exists():
                        moments.append(f"outbid 0.12 writing {tmp.name}")
                        fake.outbid(newest_live(fake), 0.12)
                        return
                time.sleep(0.01)

        def say(msg: str) -> None:
            s = _step(msg) if msg.startswith("step ") else 0
            if s >= 1 and not watching.is_set():
                watching.set()
                threading.Thread(target=mid_write, daemon=True).start()
            elif len(moments) == 1 and s >= 10:
                moments.append("outbid 5")
                outbid(5.0)

        ledger = Ledger()
        # each checkpoint's write takes 0.4 s between its files and its manifest: the outbid lands there
        opts = spot_options(max_usd=2.0, job_command=fake_command(0.2, ("--chain", "--ckpt-mb", "2",
                                                                       "--ckpt-write-s", "0.4")))
        summary = run_remote(load_spec(spec_path), va(fake), "vast", opts, ledger, str(spec_path), say=say)
        assert len(moments) == 2 and moments[0].startswith("outbid 0.12 writing .tmp-step-"), moments
        assert summary.state == "done", summary.message
        assert losses(summary.run_dir) == want_losses
        assert (summary.run_dir / "adapter" / "adapter_model.safetensors").read_bytes() == want_adapter
        # raised half again ($0.09 -> $0.135: resumed), then to the $0.20 ceiling (not enough: moved)
        assert [b["price"] for m, p, b in fake.bodies if "bid_price" in p] == [0.135, 0.2]
        assert len(fake.instances) == 2 and all(i in fake.bids for i in fake.instances)
        assert_nothing_bills(fake, ledger, remote_root)
        assert summary.usd <= 2.0
        assert job_figures(ledger, summary.job_id).preemptions == 2
    finally:
        fake.close()


# ----------------------------------------------------------------------------- fallback and crashes

def test_no_spot_capacity_falls_back_to_on_demand(sshd_factory, remote_root, tmp_path):
    fake = RunPodFake(sshd_factory, remote_root, no_spot_capacity_gpus=tuple(g["id"] for g in GPU_TYPES))
    try:
        spec_path = make_spec(tmp_path, max_steps=4, every=2)
        ledger, lines = Ledger(), []
        summary = run_remote(load_spec(spec_path), rp(fake), "runpod", spot_options(step_s=0.05), ledger,
                             str(spec_path), say=lines.append)
        assert summary.state == "done", summary.message
        assert any("falling back to on-demand" in x for x in lines)
        (pod,) = fake.instances
        assert pod not in fake.spot  # rented on-demand
        tiers = [json.loads(e["message"]) for e in ledger.events(summary.job_id) if e["kind"] == "tier"]
        assert tiers[-1]["tier"] == "on-demand" and "no capacity" in tiers[-1]["why"]
        assert_nothing_bills(fake, ledger, remote_root)
    finally:
        fake.close()


def test_a_crash_on_spot_is_a_crash_not_a_preemption(runpod, tmp_path, remote_root):
    """The job fails on a spot pod the provider still runs: reported as the failure it is, no new
    instance rented, no preemption recorded."""
    from lorapod.errors import RemoteError

    spec_path = make_spec(tmp_path, max_steps=6, every=2)
    opts = spot_options(step_s=0.05)
    opts.job_command = fake_command(0.05, ("--chain", "--fail-at", "3"))
    # a watchdog polling every 20 ms destroys the pod at once after PULLED: the job log's tail is
    # read before it (once read after it, the pod was gone under load: "connection refused")
    opts.watchdog = {**opts.watchdog, "poll_s": 0.02}
    ledger, lines = Ledger(), []
    with pytest.raises(RemoteError, match="exit 3"):
        run_remote(load_spec(spec_path), rp(runpod), "runpod", opts, ledger, str(spec_path), say=lines.append)
    assert any(x.startswith("job log (last lines)") and "boom at step 3" in x for x in lines), lines
    assert len(runpod.instances) == 1
    (job,) = ledger.jobs()
    assert not [e for e in ledger.events(job.id) if e["kind"] == "preemption"]
    assert_nothing_bills(runpod, ledger, remote_root)


# ----------------------------------------------------------------------------- the parts

class _Provider:
    name = "stub"

    def __init__(self, *states: Instance | Exception) -> None:
        self.states = list(states)

    def refresh(self, inst: Instance) -> Instance:
        s = self.states.pop(0) if len(self.states) > 1 else self.states[0]
        if isinstance(s, Exception):
            raise s
        return s


def _inst(state: str, interruptible: bool = True, message: str | None = None) -> Instance:
    return Instance("p1", "stub", state, interruptible=interruptible, message=message)  # type: ignore[arg-type]


def test_classify_tells_a_preemption_from_a_crash_and_a_lost_connection():
    from lorapod.errors import ProviderError

    spot = _inst("running")
    assert classify(_Provider(_inst("exited", message="paused: outbid")), spot) == "preempted"
    assert classify(_Provider(_inst("exited", interruptible=False)), spot) == "preempted"  # rented as spot
    assert classify(_Provider(_inst("exited", interruptible=False)), _inst("running", False)) == "failed"
    assert classify(_Provider(_inst("running")), spot) == "running"  # a lost connection, or a crash
    assert classify(_Provider(_inst("gone")), spot) == "gone"  # destroyed by someone: not a preemption
    assert classify(_Provider(ProviderError("502")), spot) == "unknown"  # never taken for a preemption


def _ctx(tmp_path, provider, inst: Instance) -> JobContext:
    from lorapod.compute.context import RunOptions
    from lorapod.rundir import RunDir

    ctx = JobContext(load_spec(make_spec(tmp_path)), provider, "stub", RunOptions(), Ledger(),
                     RunDir.create(tmp_path / "runs", "t"), "job-1", emit=lambda m: None)
    ctx.claim = Claim("i-1", "lbl", Offer("stub", "o", "RTX 3090", 0.1), None, instance=inst)
    return ctx


def test_check_preempted_waits_for_the_provider_to_report_the_stop(tmp_path):
    # RunPod reports the stop after its SIGTERM grace: "running" first, then "exited"
    ctx = _ctx(tmp_path, _Provider(_inst("running"), _inst("running"), _inst("exited")), _inst("running"))
    with pytest.raises(Preempted) as err:
        check_preempted(ctx, wait_s=5.0, every_s=0.01)
    assert err.value.instance.state == "exited"
    ctx = _ctx(tmp_path, _Provider(_inst("running")), _inst("running"))
    t = time.monotonic()
    check_preempted(ctx, wait_s=0.3, every_s=0.05)  # still running: a crash, said after the bound
    assert time.monotonic() - t < 2
    on_demand = _ctx(tmp_path, _Provider(_inst("exited", False)), _inst("running", False))
    check_preempted(on_demand, wait_s=5.0)  # not interruptible: never asks, never waits


def test_next_tier_falls_back_to_on_demand_when_the_numbers_say_so():
    # the rest: 2 h of training, 6 min of setup; spot $0.20/h against $0.50/h on-demand ($1.05 for the rest)
    base = dict(rate=0.1, rate_high=0.2, remaining_hours=2.0, setup_hours=0.1, checkpoint_every_hours=0.25,
                spot_usd_per_hour=0.2, ondemand_usd_per_hour=0.5, usd_left=None, hours_left=None)
    assert next_tier("auto", 1, 6, **base)[0] == "spot"
    tier, why = next_tier("auto", 6, 6, **base)
    assert tier == "on-demand" and "6 preemptions" in why
    tier, why = next_tier("auto", 2, 6, **{**base, "rate": 10.0, "rate_high": 30.0})  # a storm, measured
    assert tier == "on-demand" and "not less than" in why
    # spot's worst end (2/h) needs 3.6 h, on-demand 2.1 h: with 3 h left, on-demand
    tier, why = next_tier("always", 1, 6, **{**base, "rate_high": 2.0, "hours_left": 3.0})
    assert tier == "on-demand" and "deadline" in why
    assert next_tier("always", 1, 6, **{**base, "rate_high": 2.0, "hours_left": 4.0})[0] == "spot"
    # spot's worst end (3/h) costs $0.83, on-demand at $0.35/h $0.735: with $0.80 left, on-demand
    tier, why = next_tier("auto", 1, 6, **{**base, "rate_high": 3.0, "ondemand_usd_per_hour": 0.35, "usd_left": 0.8})
    assert tier == "on-demand" and "budget" in why
    assert next_tier("auto", 1, 6, **{**base, "rate_high": 3.0, "ondemand_usd_per_hour": 0.35,
                                      "usd_left": 0.9})[0] == "spot"
    assert next_tier("auto", 1, 6, **{**base, "remaining_hours": None})[0] == "spot"


def test_settle_drops_a_checkpoint_cut_off_mid_pull_and_cuts_the_metrics(tmp_path):
    import hashlib

    run = tmp_path / "run"
    for step in (2, 4, 6):
        d = run / "checkpoints" / f"step-{step}"
        d.mkdir(parents=True)
        (d / "state.json").write_text(json.dumps({"step": step}))
        (d / "optimizer.bin").write_bytes(b"x" * 1000)
        manifest = {n: {"bytes": (d / n).stat().st_size, "sha256": hashlib.sha256((d / n).read_bytes()).hexdigest()}
                    for n in ("state.json", "optimizer.bin")}
        (d / "manifest.json").write_text(json.dumps(manifest))
    (run / "checkpoints" / "step-6" / "optimizer.bin").write_bytes(b"x" * 10)  # cut off mid-pull
    (run / "checkpoints" / "step-8").mkdir()  # its manifest never came: cut off too
    (run / "checkpoints" / "step-8" / "state.json").write_text("{}")
    lines = [json.dumps({"step": s, "loss": 1.0 / s}) + "\n" for s in range(1, 8)]
    (run / "metrics.jsonl").write_text("".join(lines) + '{"step": 8, "lo')  # the last line cut off too
    assert settle_run_folder(run) == 4
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step-2", "step-4"]
    assert (run / "metrics.jsonl").read_text() == "".join(lines[:4])
    empty = tmp_path / "empty"
    (empty / "checkpoints").mkdir(parents=True)
    (empty / "metrics.jsonl").write_text("".join(lines[:3]))
    assert settle_run_folder(empty) is None  # nothing whole came home: the job starts over
    assert (empty / "metrics.jsonl").read_text() == ""


# ----------------------------------------------------------------------------- the command line

def test_lorapod_run_spot_auto_picks_spot_survives_a_preemption_and_says_what_it_cost(runpod, tmp_path, remote_root):
    """``lorapod run SPEC --spot auto`` on the RunPod fake: the plan's tier choice is spot (an RTX
    4090 at its bid beats its on-demand price), a preemption mid-step is recovered from, the
    adapter is the uninterrupted run's, the summary names the preemption, its cost and the
    savings, and nothing bills."""
    from .remote_helpers import cli_argv, cli_env, fake_command_template

    spec_path = make_spec(tmp_path, max_steps=STEPS, every=EVERY, model="Qwen/Qwen2.5-0.5B", gpu="RTX 4090",
                          max_usd=1.0)
    want_losses, want_adapter = uninterrupted(tmp_path, spec_path)
    env = cli_env(RUNPOD_API_KEY=runpod.account_key, LORAPOD_RUNPOD_URL=runpod.url,
                  LORAPOD_RUNPOD_GRAPHQL_URL=runpod.graphql_url, HF_HUB_OFFLINE="1",
                  LORAPOD_JOB_COMMAND=fake_command_template(0.25, "--chain --ckpt-mb 1"))
    proc = subprocess.Popen([*cli_argv(), "run", str(spec_path), "--on", "runpod", "--spot", "auto", "--json",
                             "--python", sys.executable, "--deps", "none", "--poll-s", "0.2", "--pull-every-s", "0.3",
                             "--ready-deadline-s", "20", "--watchdog-poll-s", "0.2", "--heartbeat-timeout-s", "3",
                             "--preempt-confirm-s", "3"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        deadline = time.monotonic() + 90
        while _remote_metric_steps(remote_root) < 5:
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.05)
        runpod.preempt(newest_live(runpod), grace_s=0.5)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err[-3000:]
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["state"] == "done" and "compute.spot: auto: spot on RTX 4090" in err
    assert summary["spot"]["preemptions"] == 1 and summary["spot"]["saved_usd"] is not None
    assert "spot: 1 preemption(s) costing $" in summary["message"] and "vs on-demand" in summary["message"]
    run = Path(summary["run_dir"])
    assert losses(run) == want_losses
    assert (run / "adapter" / "adapter_model.safetensors").read_bytes() == want_adapter
    assert len(runpod.instances) == 2 and all(p in runpod.spot for p in runpod.instances)
    assert summary["usd"] <= 1.0
    assert_nothing_bills(runpod, Ledger(), remote_root)
    # ps and logs show the one meter: the preemption, its cost, the savings
    ps = subprocess.run([*cli_argv(), "ps", "--json"], capture_output=True, text=True, env=env, timeout=60)
    (row,) = json.loads(ps.stdout)
    assert row["spot"] == summary["spot"] and row["instances"] == 2
    ps = subprocess.run([*cli_argv(), "ps"], capture_output=True, text=True, env={**env, "COLUMNS": "160"}, timeout=60)
    assert f"{summary['job_id']} spot: 1 preemption(s) costing $" in ps.stdout and "2 instance(s)" in ps.stdout
    logs = subprocess.run([*cli_argv(), "logs", summary["job_id"]], capture_output=True, text=True, env=env,
                          timeout=60)
    assert "[spot] spot: 1 preemption(s) costing $" in logs.stdout, logs.stderr


def _remote_metric_steps(remote_root: Path) -> int:
    best = 0
    for f in remote_root.glob("*/run/metrics.jsonl"):
        for line in f.read_text().splitlines():
            try:
                best = max(best, int(json.loads(line).get("step") or 0))
            except ValueError:
                continue
    return best


def test_after_a_preemption_the_one_cap_counts_every_instance(tmp_path):
    """The job's dollars are every instance's (husks included) in the one ledger: when they reach
    the cap (less the stop margin at the next rate), the job stops instead of renting again."""
    from lorapod.compute.recovery import SpotRun, SpotStop

    ctx = _ctx(tmp_path, _Provider(_inst("running")), _inst("running"))
    ctx.max_usd = 1.0
    ledger = ctx.ledger
    for usd_per_hour in (3600 * 0.45, 3600 * 0.4):  # two instances of the job, $0.45 and $0.40 for one second each
        row = ledger.instance_creating("stub", "job-1", usd_per_hour, "RTX 3090")
        ledger.instance_created(row, "p-" + row, usd_per_hour)
        ledger._db.execute("UPDATE instances SET created_at=?, destroyed_at=?, state='destroyed' WHERE id=?",
                           (1000.0, 1001.0, row))
    ledger._db.commit()
    spot = SpotRun(ctx, None)
    spot._check_caps(rate=0.2)  # $0.85 spent: room left
    ctx.opts.stop_margin_s = 3600.0  # an hour's margin at $0.20/h: $1.05 > $1
    with pytest.raises(SpotStop, match="max-usd cap"):
        spot._check_caps(rate=0.2)
    ctx.max_usd, ctx.max_hours = None, 0.5
    ctx.opts.stop_margin_s = 1800.0
    with pytest.raises(SpotStop, match="max-hours cap"):
        spot._check_caps(rate=0.2)


@pytest.mark.slow
def test_the_real_engine_preempted_mid_run_resumes_bit_exact(runpod, tmp_path, remote_root):
    """lorapod's own engine on the built-in tiny model (CPU): a spot pod preempted mid-run, the job
    resumed on a new pod from the newest checkpoint that came home; every step's loss and the
    adapter equal an uninterrupted `lorapod train` of the same spec, bit for bit."""
    from lorapod.compute.remote import default_job_command

    spec_path = make_spec(tmp_path, max_steps=12, every=3, n_examples=40, model="lorapod:tiny-llama")
    local = tmp_path / "uninterrupted"
    subprocess.run([sys.executable, "-m", "lorapod", "train", str(spec_path), "--run-dir", str(local)], check=True,
                   capture_output=True, timeout=300, cwd=tmp_path)
    moments: list[str] = []

    def say(msg: str) -> None:
        if not moments and msg.startswith("step ") and _step(msg) >= 5:
            moments.append("mid-run")
            threading.Thread(target=runpod.preempt, args=(newest_live(runpod), 0.5), daemon=True).start()

    opts = fast_options(job_command=default_job_command, spot=True, spot_policy="always", preempt_confirm_s=3.0,
                        stop_wait_s=60, ready_deadline_s=60, reconnect_s=60,
                        watchdog={"poll_s": 0.5, "heartbeat_timeout_s": 60, "done_grace_s": 30, "stall_s": 300})
    ledger = Ledger()
    summary = run_remote(load_spec(spec_path), rp(runpod), "runpod", opts, ledger, str(spec_path), say=say)
    assert moments and summary.state == "done", summary.message
    assert losses(summary.run_dir) == losses(local)
    from safetensors.torch import load_file

    got, want = (load_file(str(r / "adapter" / "adapter_model.safetensors")) for r in (summary.run_dir, local))
    assert got.keys() == want.keys() and all(got[k].equal(want[k]) for k in want)
    assert len(runpod.instances) == 2 and job_figures(ledger, summary.job_id).preemptions == 1
    assert_nothing_bills(runpod, ledger, remote_root)


def test_final_pull_brings_a_file_rewritten_in_the_same_second_at_the_same_size(tmp_path):
    """rsync's quick check (size and whole-second mtime) skips a file the instance rewrote within
    the second it was pulled, at the same size (the engine saves a checkpoint twice at one step; a
    resumed run rewrites one): the final pull removes the copies that differ and pulls again."""
    import hashlib
    import os
    import shutil
    from types import SimpleNamespace

    from lorapod.compute.follow import Follower, Progress

    remote, local = tmp_path / "remote", tmp_path / "local"
    for root, data in ((remote, b"new state"), (local, b"old state")):
        (root / "checkpoints" / "step-6").mkdir(parents=True)
        f = root / "checkpoints" / "step-6" / "state.json"
        f.write_bytes(data)
        os.utime(f, (1_000_000, 1_000_000))  # the same second, the same size

    def rsync_quick_check(why, newest_only=False):
        for src in remote.rglob("*"):
            if src.is_file():
                dst = local / src.relative_to(remote)
                if not dst.is_file() or (dst.stat().st_size, int(dst.stat().st_mtime)) != (
                        src.stat().st_size, int(src.stat().st_mtime)):
                    dst.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(src, dst)
        return SimpleNamespace(files_transferred=1)

    def manifest(_py):
        return {str(p.relative_to(remote)): [p.stat().st_size, hashlib.sha256(p.read_bytes()).hexdigest()]
                for p in remote.rglob("*") if p.is_file()}

    said: list[str] = []
    ctx = SimpleNamespace(remote=lambda fn, what: fn(), say=said.append, run=SimpleNamespace(root=local),
                          provider=SimpleNamespace(traits=SimpleNamespace(borrowed=False)))
    work = SimpleNamespace(manifest=manifest, mark_pulled=lambda: None,
                           sh=lambda *a, **k: SimpleNamespace(returncode=1, stdout=b""), q=lambda *a: "x")
    follower = Follower(ctx, None, work, SimpleNamespace(boot=SimpleNamespace(python="python3")), None, Progress(),
                        SimpleNamespace(pull=rsync_quick_check, leaves=lambda k: False))
    follower.final_pull()
    assert (local / "checkpoints" / "step-6" / "state.json").read_bytes() == b"new state"
    assert any("files differ" in m for m in said) and any("final pull verified" in m for m in said)
