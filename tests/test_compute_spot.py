"""Interruptible (spot) rentals on the RunPod and Vast.ai fakes, as the providers' sources say
(tests/fakes/runpod_fake.py and vast_fake.py cite them): bids within the ceiling, RunPod's
GraphQL ``podRentInterruptable``, Vast's ``price``, no spot capacity, RunPod's preemption (SIGTERM,
SIGKILL 5 s later, the pod stopped) and Vast's pause when outbid (disk kept and billed, resumes
when the bid wins). ``lorapod run`` does not rent spot yet; these are the provider layer's parts."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lorapod.compute.offers import spot_requirements
from lorapod.compute.provider import InstanceSpec, NoCapacity, Requirements
from lorapod.compute.runpod.api import RunPodApi
from lorapod.compute.runpod.provider import RunPodProvider
from lorapod.compute.vast.api import VastApi
from lorapod.compute.vast.provider import VastProvider
from lorapod.errors import SpecError
from lorapod.spec import load_spec

from .fakes.runpod_fake import RunPodFake
from .fakes.vast_fake import VastFake

KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIJ0 test"
SDXL = Path(__file__).resolve().parents[1] / "examples" / "sdxl-object-lora.yaml"
# a process in the "container" that notes SIGTERM in a file outside it and goes on (so it needs SIGKILL)
STUBBORN = ("import pathlib, signal, sys, time\n"
            "signal.signal(signal.SIGTERM, lambda *a: pathlib.Path(sys.argv[1]).write_text('TERM'))\n"
            "for _ in range(600): time.sleep(0.1)\n")


def rp(fake: RunPodFake) -> RunPodProvider:
    return RunPodProvider(RunPodApi(fake.account_key, base_url=fake.url, graphql_url=fake.graphql_url,
                                    backoff_s=0.05, timeout=10))


def va(fake: VastFake) -> VastProvider:
    return VastProvider(VastApi(fake.account_key, base_url=fake.url, backoff_s=0.05, timeout=10))


def until(provider, inst, state: str, timeout: float = 15.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        inst = provider.refresh(inst)
        if inst.state == state:
            return inst
        time.sleep(0.1)
    raise AssertionError(f"{inst.id} never reached {state}: {inst}")


def in_container(fake, inst_id: str, workdir: Path, flag: Path, stubborn: bool = True) -> subprocess.Popen:
    """A process "inside" the fake instance: the fake finds its processes by their marker variable."""
    workdir.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "LORAPOD_FAKE_INSTANCE": fake.instances[inst_id].marker}
    code = STUBBORN if stubborn else "import time\nfor _ in range(600): time.sleep(0.1)\n"
    proc = subprocess.Popen([sys.executable, "-c", code, str(flag)], cwd=workdir, env=env)
    time.sleep(0.3)  # its handler is installed
    return proc


@pytest.fixture
def vast(sshd_factory, remote_root):
    fake = VastFake(sshd_factory, remote_root, key_delay_s=0.0)
    yield fake
    fake.close()


# ----------------------------------------------------------------------------- the requirements

def test_spot_requirements_follow_compute_spot_and_the_caps():
    with pytest.raises(SpecError, match="never"):
        spot_requirements(load_spec(SDXL))
    req = spot_requirements(load_spec(SDXL, ["compute.spot=auto", "compute.max_bid_per_gpu_hour=0.3"]))
    # the example's cap: $5 over 3 h -> at most $1.67/h; the bid ceiling is the lower
    assert req.interruptible and req.max_bid_per_gpu_hour == 0.3
    req = spot_requirements(load_spec(SDXL, ["compute.spot=auto", "compute.max_usd=0.3", "compute.max_hours=2"]))
    assert req.max_bid_per_gpu_hour == pytest.approx(0.15)  # the dollar cap's hourly rate


# ----------------------------------------------------------------------------- RunPod

def test_runpod_spot_offers_are_bids_within_the_ceiling(runpod):
    prov = rp(runpod)
    offers = prov.offers(Requirements(interruptible=True, max_bid_per_gpu_hour=0.25))
    got = {(o.gpu_name, o.extra["cloud_type"], o.bid_per_gpu_hour) for o in offers}
    # 4090 secure spot is $0.30 (over the ceiling); the A40 and the A4000 have no minimumBidPrice
    assert got == {("RTX 3090", "SECURE", 0.2), ("RTX 3090", "COMMUNITY", 0.11), ("RTX 4090", "COMMUNITY", 0.2)}
    assert all(o.interruptible and o.usd_per_hour == o.bid_per_gpu_hour for o in offers)
    assert not any(o.interruptible for o in prov.offers(Requirements()))  # on-demand unchanged


def test_runpod_spot_pod_is_rented_with_its_bid_through_graphql(runpod):
    prov = rp(runpod)
    offer = next(o for o in prov.offers(Requirements(interruptible=True))
                 if o.gpu_name == "RTX 4090" and o.extra["cloud_type"] == "COMMUNITY")
    inst = prov.create(offer, InstanceSpec("spot", KEY))
    assert inst.interruptible
    (_, _, sent), = [b for b in runpod.bodies if b[1] == "/graphql" and "podRentInterruptable" in str(b[2])]
    inp = sent["variables"]["input"]
    assert inp["bidPerGpu"] == 0.2 and inp["gpuTypeId"] == "NVIDIA GeForce RTX 4090" and inp["cloudType"] == "COMMUNITY"
    assert inp["ports"] == "22/tcp" and {"key": "PUBLIC_KEY", "value": KEY} in inp["env"]
    assert inp["allowedCudaVersions"] and inp["minVcpuCount"] == 4 and inp["volumeInGb"] == 0
    assert runpod.spot[inst.id] == 0.2
    running = until(prov, inst, "running")
    assert running.interruptible and running.usd_per_hour == 0.2
    prov.destroy(inst.id)
    assert prov.refresh(inst).state == "gone" and runpod.live() == [] and runpod.violations == []


def test_runpod_no_spot_capacity_is_no_capacity(sshd_factory, remote_root):
    fake = RunPodFake(sshd_factory, remote_root, no_spot_capacity_gpus=("NVIDIA GeForce RTX 4090",))
    try:
        prov = rp(fake)
        spot = next(o for o in prov.offers(Requirements(interruptible=True)) if o.gpu_name == "RTX 4090")
        with pytest.raises(NoCapacity):
            prov.create(spot, InstanceSpec("s", KEY))
        ondemand = next(o for o in prov.offers(Requirements()) if o.gpu_name == "RTX 4090")
        inst = prov.create(ondemand, InstanceSpec("o", KEY))  # on-demand of the same type still rents
        assert not inst.interruptible
        prov.destroy(inst.id)
        assert fake.live() == [] and fake.violations == []
    finally:
        fake.close()


def test_runpod_preemption_is_sigterm_then_sigkill_then_a_stopped_pod(runpod, remote_root, tmp_path):
    prov = rp(runpod)
    offer = next(o for o in prov.offers(Requirements(interruptible=True)) if o.gpu_name == "RTX 3090")
    inst = until(prov, prov.create(offer, InstanceSpec("p", KEY)), "running")
    work = remote_root / "job-p"
    stubborn = in_container(runpod, inst.id, work, tmp_path / "stubborn")
    polite = in_container(runpod, inst.id, work, tmp_path / "polite", stubborn=False)  # dies of the TERM
    t0 = time.monotonic()
    runpod.preempt(inst.id, grace_s=1.0)
    assert time.monotonic() - t0 >= 1.0  # the grace, for the process that outlived the TERM
    assert stubborn.wait(5) == -9 and polite.wait(5) == -15
    assert (tmp_path / "stubborn").read_text() == "TERM"  # it was warned first
    sigs = runpod.instances[inst.id].signals
    assert (stubborn.pid, "TERM") in sigs and (stubborn.pid, "KILL") in sigs and (polite.pid, "KILL") not in sigs
    assert not work.exists()  # the container disk is erased on stop
    after = prov.refresh(inst)
    assert after.state == "exited" and after.interruptible and "preempted" in after.message
    assert not after.ssh_ready
    assert [i.id for i in prov.list_instances()] == [inst.id]  # the husk stays until destroyed
    assert runpod.stopped_usd_per_hour(inst.id) == 0.0  # no volume disk: nothing billed while stopped
    prov.destroy(inst.id)
    assert prov.refresh(inst).state == "gone" and runpod.live() == [] and runpod.violations == []


def test_runpod_rest_interruptible_pod_and_its_stopped_volume_bill(runpod):
    api = RunPodApi(runpod.account_key, base_url=runpod.url, graphql_url=runpod.graphql_url, backoff_s=0.05)
    pod = api.create_pod({"name": "rest-spot", "imageName": "runpod/pytorch:1.0.2-cu1281-torch280-ubuntu2404",
                          "gpuTypeIds": ["NVIDIA GeForce RTX 3090"], "cloudType": "SECURE", "interruptible": True,
                          "volumeInGb": 20, "containerDiskInGb": 20, "env": {"PUBLIC_KEY": KEY}})
    assert pod["interruptible"] is True and pod["costPerHr"] == 0.2  # the secure spot price: REST has no bid
    runpod.preempt(pod["id"], grace_s=0.1)
    assert api.get_pod(pod["id"])["desiredStatus"] == "EXITED"
    assert runpod.stopped_usd_per_hour(pod["id"]) == pytest.approx(20 * 0.20 / 730)  # the volume, $0.20/GB-month
    api.delete_pod(pod["id"])
    assert runpod.live() == [] and runpod.violations == []


# ----------------------------------------------------------------------------- Vast.ai

def test_vast_interruptible_offers_bid_their_min_bid_within_the_ceiling(vast):
    prov = va(vast)
    offers = prov.offers(Requirements(interruptible=True, max_bid_per_gpu_hour=0.1, disk_gb=50))
    search = next(b for m, p, b in vast.bodies if p.startswith("/api/v0/bundles"))
    assert search["type"] == "bid"
    # 9002's min_bid $0.12 is over the ceiling; 9000's host cannot start the image; 9003/9004 are filtered
    assert [(o.id, o.bid_per_gpu_hour) for o in offers] == [("9001", 0.09)]
    assert offers[0].usd_per_hour == pytest.approx(0.09 + 0.1 * 50 / 730, abs=1e-6)  # bid + the disk
    assert prov.offers(Requirements(interruptible=True, max_bid_per_gpu_hour=0.01, disk_gb=50)) == []
    assert vast.violations == []


def test_vast_outbid_pauses_keeps_the_disk_bills_storage_and_resumes(vast, remote_root, tmp_path):
    prov = va(vast)
    offer = next(o for o in prov.offers(Requirements(interruptible=True, disk_gb=50)) if o.id == "9001")
    inst = prov.create(offer, InstanceSpec("b", KEY, disk_gb=50))
    put = next(b for m, p, b in vast.bodies if m == "PUT" and p.startswith("/api/v0/asks/"))
    assert put["price"] == 0.09 and inst.interruptible
    inst = until(prov, inst, "running")
    work = remote_root / "job-b"
    proc = in_container(vast, inst.id, work, tmp_path / "flag", stubborn=False)
    (work / "checkpoint.pt").write_text("state")
    assert vast.outbid(inst.id, 0.08) is False  # a lower bid does not take the machine
    assert vast.outbid(inst.id, 0.15) is True
    assert proc.wait(5) < 0  # the container stopped
    paused = prov.refresh(inst)
    assert paused.state == "exited" and paused.interruptible and "outbid" in paused.message
    assert (work / "checkpoint.pt").read_text() == "state"  # data preserved while paused
    time.sleep(0.2)
    billed = vast.paused_storage_usd(inst.id)
    assert billed == pytest.approx(vast.instances[inst.id].hours_stopped() * 50 * 0.1 / 730, rel=0.05) and billed > 0
    prov.change_bid(inst.id, 0.12)  # still below the competing $0.15: stays paused
    assert prov.refresh(inst).state == "exited"
    prov.change_bid(inst.id, 0.2)  # above it: resumes on the same disk
    assert until(prov, inst, "running").interruptible
    assert (work / "checkpoint.pt").read_text() == "state"
    assert vast.outbid(inst.id, 0.3) and prov.refresh(inst).state == "exited"
    vast.outbid_ends(inst.id)  # the higher bid goes: it resumes by itself
    until(prov, inst, "running")
    prov.destroy(inst.id)
    assert prov.refresh(inst).state == "gone" and vast.live() == [] and vast.violations == []


def test_vast_bid_below_min_bid_never_runs(vast):
    prov = va(vast)
    offer = next(o for o in prov.offers(Requirements(interruptible=True, disk_gb=50)) if o.id == "9001")
    low = offer.__class__(**{**offer.to_dict(), "bid_per_gpu_hour": 0.05})
    inst = prov.create(low, InstanceSpec("low", KEY, disk_gb=50))
    time.sleep(0.5)
    assert prov.refresh(inst).state == "exited"  # created, outbid from the start: a husk to destroy
    prov.destroy(inst.id)
    assert vast.live() == [] and vast.violations == []


def test_run_tier_follows_the_plan_and_the_spot_flag(runpod, tmp_path, monkeypatch):
    """``lorapod run``: --spot overrides compute.spot; always rents spot where the provider has a
    tier (refused before renting where it has none); auto follows the plan's tier choice."""
    from lorapod.compute.prepare import RunFlags, prepare_run
    from lorapod.compute.recovery import run_tier
    from lorapod.compute.ssh import SSHProvider
    from lorapod.plan.choose import plan_job
    from lorapod.store.ledger import Ledger

    from .remote_helpers import make_spec

    monkeypatch.setenv("RUNPOD_API_KEY", runpod.account_key)
    monkeypatch.setenv("LORAPOD_RUNPOD_URL", runpod.url)
    monkeypatch.setenv("LORAPOD_RUNPOD_GRAPHQL_URL", runpod.graphql_url)
    spec = make_spec(tmp_path, model="lorapod:tiny-llama")
    with pytest.raises(SpecError, match="no spot tier"):
        run_tier(load_spec(spec, ["compute.spot=always"]), SSHProvider("ssh://u@h:22"), None)
    notes: list[str] = []
    prepared = prepare_run(spec, "runpod", RunFlags(spot="always"), ledger=Ledger(), say=lambda m: None,
                           note=notes.append)
    assert prepared.spec.compute.spot == "always" and prepared.options.spot is True
    assert prepared.options.spot_policy == "always"
    prepared = prepare_run(spec, "runpod", RunFlags(spot="never", set_=["compute.spot=always"]), ledger=Ledger(),
                           say=lambda m: None, note=notes.append)
    assert prepared.options.spot is False  # the flag wins over the spec
    sdxl = load_spec(SDXL, ["compute.spot=auto"])
    on_spot, why = run_tier(sdxl, rp(runpod), None)
    assert not on_spot and "cannot price" in why  # no planned job: on-demand, said
    from lorapod.plan.job import build_job

    job = build_job(sdxl, images=25)
    on_spot, why = run_tier(sdxl, rp(runpod), job)
    choice = plan_job(sdxl, provider="runpod", job=job).tier
    assert on_spot == (choice.tier == "spot") and choice.reason in why
    # always, but no spot GPU's save on SIGTERM fits RunPod's 5 s: refused before anything is rented
    slow = load_spec(SDXL, ["compute.spot=always", "compute.spot_save_mb_s=20"])
    with pytest.raises(SpecError, match="a checkpoint takes about"):
        run_tier(slow, rp(runpod), build_job(slow, images=25))
    assert runpod.instances == {}  # nothing rented by deciding
