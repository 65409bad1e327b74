"""RunPod and Vast.ai end to end against local fake control planes that follow the providers'
OpenAPI documents, with real sshd "instances": retries, capacity failures, teardown from inside."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lorapod.compute.httpapi import ApiError
from lorapod.compute.runpod.api import RunPodApi
from lorapod.compute.runpod.provider import RunPodProvider
from lorapod.compute.session import run_remote
from lorapod.compute.vast.api import VastApi
from lorapod.compute.vast.provider import VastProvider
from lorapod.spec import load_spec
from lorapod.store.identity import instance_label
from lorapod.store.ledger import Ledger

from .fakes.runpod_fake import RunPodFake
from .fakes.vast_fake import VastFake
from .remote_helpers import cli_argv, cli_env, fake_command, fake_command_template, fast_options, make_spec


@pytest.fixture
def vast(sshd_factory, remote_root):
    fake = VastFake(sshd_factory, remote_root)
    yield fake
    fake.close()


def rp_provider(fake: RunPodFake, key: str | None = None) -> RunPodProvider:
    return RunPodProvider(RunPodApi(key or fake.account_key, base_url=fake.url, graphql_url=fake.graphql_url,
                                    backoff_s=0.05, timeout=10))


def vast_provider(fake: VastFake, key: str | None = None) -> VastProvider:
    return VastProvider(VastApi(key or fake.account_key, base_url=fake.url, backoff_s=0.05, timeout=10))


def run(tmp_path, provider, target, **kw):
    spec_path = make_spec(tmp_path)
    ledger = Ledger()
    opts = fast_options(job_command=kw.pop("job_command", fake_command(0.05)), **kw)
    summary = run_remote(load_spec(spec_path), provider, target, opts, ledger, str(spec_path), say=lambda m: None)
    return summary, ledger


def assert_clean(fake, ledger, remote_root):
    assert fake.live() == [], "an instance is still alive at the provider"
    assert fake.running_processes() == []
    assert ledger.instances(live_only=True) == []
    assert list(remote_root.iterdir()) == []
    assert fake.violations == [], fake.violations


def test_runpod_e2e_with_retries_on_429_and_500(runpod, tmp_path, remote_root):
    from .fakes.base import Fault

    runpod.faults += [Fault("POST", "/pods", 429, times=2), Fault("GET", r"/pods/\w+", 500, times=2),
                      Fault("DELETE", r"/pods/\w+", 503, times=1)]
    summary, ledger = run(tmp_path, rp_provider(runpod), "runpod")
    assert summary.state == "done" and summary.last_step == 8
    assert (summary.run_dir / "adapter" / "adapter_model.safetensors").is_file()
    assert_clean(runpod, ledger, remote_root)
    (row,) = ledger.instances()
    assert row.usd_per_hour == 0.22 and row.gpu_name == "RTX 3090"  # the cheapest: RTX 3090 community
    statuses = [c for c in runpod.calls if c[0] == "POST" and c[1] == "/pods"]
    assert [s for _, _, s in statuses] == [429, 429, 201]
    (pod,) = runpod.instances.values()
    assert pod.deleted_by in ("account key", "pod-scoped key")


class SkewedClock:
    """``time`` as acquire.py and wait.py see it, with a monotonic clock the test moves forward:
    the deadline of an instance that never gets ready passes after a few of its polls, whatever the
    machine's load, while the next offer boots against the real clock and a generous deadline."""

    def __init__(self) -> None:
        self.offset = 0.0

    def monotonic(self) -> float:
        return time.monotonic() + self.offset

    def __getattr__(self, name: str):
        return getattr(time, name)


def test_runpod_never_ready_is_destroyed_and_next_offer_tried(sshd_factory, remote_root, tmp_path, monkeypatch):
    """Waits on conditions (issue 48, F17): with ready_deadline_s=2 the offer that does boot had
    2 s of real time too, which a loaded machine's SSH handshake alone could use up. Now the
    deadline is 120 s; the never-ready pod's wait is ended by the clock moving 50 s at each of
    its polls (the provider saying "not ready" is the condition), the next pod's by SSH answering."""
    from lorapod.compute import acquire, wait

    clock = SkewedClock()
    monkeypatch.setattr(acquire, "time", clock)
    monkeypatch.setattr(wait, "time", clock)
    fake = RunPodFake(sshd_factory, remote_root, never_ready_gpus=("NVIDIA GeForce RTX 3090",))
    provider = rp_provider(fake)
    real_refresh = provider.refresh

    def refresh(inst):
        now = real_refresh(inst)
        if now.gpu_name == "RTX 3090" and not now.ssh_ready:
            clock.offset += 50.0  # one poll of a pod that is not ready: time passes for its deadline
        return now

    monkeypatch.setattr(provider, "refresh", refresh)
    try:
        summary, ledger = run(tmp_path, provider, "runpod", ready_deadline_s=120.0)
        assert clock.offset >= 100  # the never-ready pod's deadline passed by its polls, not by the clock
        assert summary.state == "done"
        first, second = ledger.instances()
        assert first.gpu_name == "RTX 3090" and first.state == "destroyed" and first.ready_at is None
        assert second.gpu_name == "RTX 4090" and second.state == "destroyed"
        assert_clean(fake, ledger, remote_root)
    finally:
        fake.close()


def test_runpod_bad_key_is_clear_and_nothing_created(runpod, tmp_path, remote_root):
    with pytest.raises(ApiError, match="refused the API key") as exc:
        run(tmp_path, rp_provider(runpod, key="wrong-key"), "runpod")
    assert "wrong-key" not in str(exc.value)
    assert runpod.instances == {}
    assert Ledger().instances() == []


def test_runpod_unknown_gpu_names_the_known_ones(runpod, tmp_path):
    from lorapod.errors import PlanError

    with pytest.raises(PlanError, match="no offer for GPU 'H900'") as exc:
        run(tmp_path, rp_provider(runpod), "runpod", gpu="H900")
    assert "RTX 3090" in exc.value.hint


def test_vast_e2e_and_dead_offer_skipped(sshd_factory, remote_root, tmp_path):
    fake = VastFake(sshd_factory, remote_root, dead_offers=(9001,))
    try:
        summary, ledger = run(tmp_path, vast_provider(fake), "vast")
        assert summary.state == "done" and summary.last_step == 8
        first, second = ledger.instances()
        assert (first.gpu_name, first.state) == ("RTX 3090", "destroyed")  # exited: never becomes running
        assert (second.gpu_name, second.state) == ("RTX 4090", "destroyed")
        assert_clean(fake, ledger, remote_root)
    finally:
        fake.close()


def test_contract_violation_is_caught(vast):
    api = VastApi(vast.account_key, base_url=vast.url, backoff_s=0.01)
    with pytest.raises(ApiError):
        api.request("PUT", "/api/v0/asks/9001/", json_body={"label": "no image"})  # 'image' is required
    assert vast.violations and "image" in vast.violations[0]
    vast.violations.clear()


def _cli_run(fake_env: dict, spec: Path, target: str, *extra: str) -> subprocess.Popen:
    env = cli_env(LORAPOD_JOB_COMMAND=fake_command_template(0.25), **fake_env)
    return subprocess.Popen([*cli_argv(), "run", str(spec), "--on", target, "--python", sys.executable,
                             "--poll-s", "0.2", "--pull-every-s", "0.5", "--ready-deadline-s", "20",
                             "--watchdog-poll-s", "0.3", "--heartbeat-timeout-s", "2", *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def _wait(cond, timeout, what):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out: {what}")


@pytest.mark.parametrize("which", ["runpod", "vast"])
def test_sigkilled_controller_watchdog_deletes_through_the_api(which, runpod, vast, tmp_path, remote_root):
    fake = runpod if which == "runpod" else vast
    env = ({"RUNPOD_API_KEY": fake.account_key, "LORAPOD_RUNPOD_URL": fake.url,
            "LORAPOD_RUNPOD_GRAPHQL_URL": runpod.graphql_url} if which == "runpod"
           else {"VAST_API_KEY": fake.account_key, "LORAPOD_VAST_URL": fake.url})
    spec = make_spec(tmp_path, max_steps=10, every=2)
    proc = _cli_run(env, spec, which)
    try:
        _wait(lambda: (Ledger().jobs() or [None])[0] is not None and (Ledger().jobs()[0].last_step or 0) >= 3, 60,
              "step 3")
        time.sleep(0.8)
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
    _wait(lambda: not fake.live(), 30, "the watchdog to delete the instance")
    (inst,) = fake.instances.values()
    assert inst.deleted_by in ("pod-scoped key", "container key")  # from inside, not with the account key
    assert any(ua.startswith("lorapod-watchdog/") for ua in fake.user_agents)  # never urllib's default
    assert not any(ua.startswith(("Python-urllib", "python-httpx")) for ua in fake.user_agents)
    out = subprocess.run([*cli_argv(), "down", "--orphans", "--json"], capture_output=True, text=True,
                         env=cli_env(**env), timeout=60)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["reconciled"] == 1
    ledger = Ledger()
    assert ledger.instances(live_only=True) == []
    (job,) = ledger.jobs()
    assert job.state == "stopped"
    ckpts = sorted((Path(job.run_dir) / "checkpoints").iterdir())
    assert ckpts and all(json.loads((c / "state.json").read_text())["step"] == int(c.name[5:]) for c in ckpts)
    assert fake.running_processes() == [] and list(remote_root.iterdir()) == []
    assert fake.violations == [], fake.violations


def test_destroy_is_idempotent(runpod, vast):
    from lorapod.compute.provider import InstanceSpec, Offer

    for prov, offer in ((rp_provider(runpod), Offer("runpod", "NVIDIA GeForce RTX 3090|COMMUNITY", "RTX 3090", 0.22)),
                        (vast_provider(vast), Offer("vast", "9001", "RTX 3090", 0.19))):
        inst = prov.create(offer, InstanceSpec("idem", "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIJ0 test"))
        prov.destroy(inst.id)
        prov.destroy(inst.id)  # already gone: still success
        assert prov.refresh(inst).state == "gone"
        assert all(i.id != inst.id for i in prov.list_instances())
    assert runpod.violations == [] and vast.violations == []


def test_ctrl_c_while_waiting_for_boot_destroys_the_pod(sshd_factory, remote_root, tmp_path):
    from .fakes.runpod_fake import GPU_TYPES

    fake = RunPodFake(sshd_factory, remote_root, never_ready_gpus=tuple(g["id"] for g in GPU_TYPES))
    try:
        env = {"RUNPOD_API_KEY": fake.account_key, "LORAPOD_RUNPOD_URL": fake.url,
               "LORAPOD_RUNPOD_GRAPHQL_URL": fake.graphql_url}
        proc = _cli_run(env, make_spec(tmp_path), "runpod")
        try:
            _wait(lambda: fake.live(), 30, "a pod to be created")
            time.sleep(0.5)
            proc.send_signal(signal.SIGINT)
            _, err = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
        assert proc.returncode == 130, err
        assert fake.live() == [] and fake.violations == []
        ledger = Ledger()
        assert ledger.instances(live_only=True) == []
        assert ledger.jobs()[0].state == "interrupted"
    finally:
        fake.close()


def test_orphan_sweep_and_down_all(runpod, monkeypatch, tmp_path):
    """--orphans spares a job whose controller is alive, destroys a lorapod-labelled pod the ledger
    never heard of; --all destroys everything live in the ledger."""
    from lorapod.compute.jobs import down_orphans
    from lorapod.compute.provider import InstanceSpec, Offer

    monkeypatch.setenv("RUNPOD_API_KEY", runpod.account_key)
    monkeypatch.setenv("LORAPOD_RUNPOD_URL", runpod.url)
    monkeypatch.setenv("LORAPOD_RUNPOD_GRAPHQL_URL", runpod.graphql_url)
    prov = rp_provider(runpod)
    offer = Offer("runpod", "NVIDIA GeForce RTX 3090|COMMUNITY", "RTX 3090", 0.22)
    key = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIJ0 test"
    # e.g. a crash inside create(): our installation's label, unknown to the ledger
    stray = prov.create(offer, InstanceSpec("lost-job", key, name=instance_label("i-0123456789ab", "lost-job")))
    theirs = prov.create(offer, InstanceSpec("their-job", key, name="lorapod-0badc0de-0123456789ab-their-job"))
    legacy = prov.create(offer, InstanceSpec("old-job", key))  # "lorapod-old-job": no installation id
    ledger = Ledger()
    ledger.job_started("live-job", str(tmp_path / "r"), "runpod", "runpod", None, None, None)  # this pid: alive
    ledger.job_update("live-job", state="running")
    iid = ledger.instance_creating("runpod", "live-job", 0.22, "RTX 3090")
    ours = prov.create(offer, InstanceSpec("live-job", key))
    ledger.instance_created(iid, ours.id)

    counts = down_orphans(ledger, say=lambda m: None)
    assert counts["unknown_destroyed"] == 1 and counts["destroyed"] == 0 and counts["others_left"] == 2
    assert sorted(i.id for i in runpod.live()) == sorted([ours.id, theirs.id, legacy.id])
    assert runpod.instances[stray.id].deleted

    counts = down_orphans(ledger, say=lambda m: None, everything=True)
    assert counts["destroyed"] == 1
    assert sorted(i.id for i in runpod.live()) == sorted([theirs.id, legacy.id])
    assert ledger.instances(live_only=True) == []
    counts = down_orphans(ledger, say=lambda m: None, all_installations=True)
    assert counts["unknown_destroyed"] == 2 and runpod.live() == []
    assert ledger.job("live-job").state == "stopped"
    assert runpod.violations == []


def test_insufficient_balance_is_explained(vast, tmp_path):
    from lorapod.errors import ProviderError

    from .fakes.base import Fault

    body = {"success": False, "error": "invalid_args", "msg": "insufficient credit: balance $0.00"}
    vast.faults.append(Fault("PUT", r"/api/v0/asks/\d+/", 400, times=5, body=body))
    with pytest.raises(ProviderError, match="not enough balance") as exc:
        run(tmp_path, vast_provider(vast), "vast")
    assert "add credit" in exc.value.hint
    assert [c for c in vast.calls if c[0] == "PUT"] == [("PUT", "/api/v0/asks/9001/", 400)]  # no second offer
    assert vast.instances == {} and Ledger().instances(live_only=True) == []
    assert all(r.state == "failed" and r.usd(0) == 0 for r in Ledger().instances())
    assert vast.violations == []
