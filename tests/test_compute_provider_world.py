"""RunPod and Vast.ai as they really answer (review cloud-2026-12-01, rows 2-3, 6-20): the fakes
in tests/fakes model each behaviour from the official clients, and each test here fails on a
lorapod that assumed the kinder world."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from lorapod.compute.httpapi import ApiError
from lorapod.compute.provider import InstanceSpec, NoCapacity, Offer, Requirements
from lorapod.compute.runpod.api import RunPodApi
from lorapod.compute.runpod.provider import RunPodProvider, allowed_cuda
from lorapod.compute.session import run_remote
from lorapod.compute.transport import AuthRefused
from lorapod.compute.vast.api import VastApi
from lorapod.compute.vast.provider import VastProvider, onstart_script
from lorapod.compute.watchdog import run_recipe, run_step
from lorapod.spec import load_spec
from lorapod.store.ledger import Ledger

from .fakes.runpod_fake import RunPodFake
from .fakes.vast_fake import VastFake
from .remote_helpers import fake_command, fast_options, make_spec

KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIJ0 test"


def rp(fake: RunPodFake) -> RunPodProvider:
    return RunPodProvider(RunPodApi(fake.account_key, base_url=fake.url, graphql_url=fake.graphql_url,
                                    backoff_s=0.05, timeout=10))


def va(fake: VastFake) -> VastProvider:
    return VastProvider(VastApi(fake.account_key, base_url=fake.url, backoff_s=0.05, timeout=10))


def run(tmp_path, provider, said: list[str] | None = None, **kw):
    spec_path = make_spec(tmp_path)
    ledger = Ledger()
    opts = fast_options(job_command=fake_command(0.05), **kw)
    summary = run_remote(load_spec(spec_path), provider, provider.name, opts, ledger, str(spec_path),
                         say=(said.append if said is not None else lambda m: None))
    return summary, ledger


@pytest.fixture
def vast(sshd_factory, remote_root):
    fake = VastFake(sshd_factory, remote_root, key_delay_s=0.5)
    yield fake
    fake.close()


# ----------------------------------------------------------------------------- RunPod


def test_runpod_offers_only_types_in_stock(runpod):
    ids = {o.extra["gpu_type_id"] for o in rp(runpod).offers(Requirements())}
    assert "NVIDIA RTX A4000" not in ids  # listed with a price, lowestPrice.uninterruptablePrice null
    assert "NVIDIA GeForce RTX 3090" in ids


def test_runpod_create_asks_for_hosts_that_can_start_the_image(runpod):
    prov = rp(runpod)
    (offer,) = [o for o in prov.offers(Requirements(host_ram_gb=30.0)) if o.id == "NVIDIA GeForce RTX 3090|COMMUNITY"]
    inst = prov.create(offer, InstanceSpec("cuda", KEY))
    (body,) = [b for m, p, b in runpod.bodies if (m, p) == ("POST", "/pods")]
    assert body["allowedCudaVersions"] == ["13.0", "12.9", "12.8"]  # the default image needs CUDA 12.8
    assert body["minRAMPerGPU"] == 30 and body["minVCPUPerGPU"] == 4
    assert runpod.placed[inst.id].cuda == 12.8  # not the first (12.4) host, where it never starts
    assert runpod.violations == []
    assert allowed_cuda("someone/custom:latest") is None  # unknown CUDA: no filter rather than a guess


def test_runpod_gone_pod_answers_400_and_reads_as_gone(runpod):
    prov = rp(runpod)
    inst = prov.create(Offer("runpod", "NVIDIA GeForce RTX 4090|SECURE", "RTX 4090", 0.69), InstanceSpec("g", KEY))
    prov.destroy(inst.id)
    assert ("GET", f"/pods/{inst.id}", 400) in runpod.calls or prov.refresh(inst).state == "gone"
    assert prov.refresh(inst).state == "gone"
    assert runpod.calls[-1] == ("GET", f"/pods/{inst.id}", 400)


def test_runpod_no_capacity_is_its_own_error_and_does_not_use_up_the_offers(sshd_factory, remote_root, tmp_path):
    fake = RunPodFake(sshd_factory, remote_root,
                      no_capacity_gpus=("NVIDIA GeForce RTX 3090", "NVIDIA GeForce RTX 4090"))
    try:
        prov = rp(fake)
        with pytest.raises(NoCapacity):
            prov.create(Offer("runpod", "NVIDIA GeForce RTX 3090|COMMUNITY", "RTX 3090", 0.22), InstanceSpec("n", KEY))
        # four refusals (3090 and 4090, both clouds) come before the A40: max_offers=3 must not end it
        summary, ledger = run(tmp_path, prov, max_offers=3)
        assert summary.state == "done"
        (row,) = [r for r in ledger.instances() if r.provider_id]
        assert row.gpu_name == "A40"
        assert fake.live() == [] and fake.violations == []
    finally:
        fake.close()


def test_runpod_watchdog_recipe_destroys_with_the_pod_key_where_rest_refuses_it(runpod, monkeypatch):
    prov = rp(runpod)
    inst = prov.create(Offer("runpod", "NVIDIA GeForce RTX 4090|SECURE", "RTX 4090", 0.69), InstanceSpec("w", KEY))
    scoped = next(k for k, v in runpod.pod_keys.items() if v == inst.id)
    monkeypatch.setenv("RUNPOD_POD_ID", inst.id)
    monkeypatch.setenv("RUNPOD_API_KEY", scoped)
    import shutil

    assert shutil.which("runpodctl") is None  # this "pod" has no runpodctl: GraphQL must do it
    recipe = prov.watchdog_config(inst)["destroy"]
    assert run_recipe(recipe, timeout=10) is True, runpod.violations
    assert runpod.instances[inst.id].deleted_by == "pod-scoped key"
    assert ("POST", "/graphql", 200) in runpod.calls
    assert any(ua.startswith("lorapod-watchdog/") for ua in runpod.user_agents)
    assert not any(ua.startswith("Python-urllib") for ua in runpod.user_agents)


def test_watchdog_exec_step_passes_the_instance_key_to_runpodctl(tmp_path, monkeypatch):
    tool = tmp_path / "runpodctl"
    tool.write_text("#!/bin/sh\necho \"$@ key=$RUNPOD_API_KEY\" > \"$(dirname \"$0\")/called\"\n")
    tool.chmod(tool.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("RUNPOD_API_KEY", "pod-key")
    step = {"name": "runpodctl remove pod", "kind": "exec", "argv": ["runpodctl", "remove", "pod", "{RUNPOD_POD_ID}"],
            "env": ["RUNPOD_API_KEY"]}
    assert run_step(step, {"RUNPOD_POD_ID": "abc123"}, None, 10, "ua") == "done"
    assert (tmp_path / "called").read_text().strip() == "remove pod abc123 key=pod-key"


# ----------------------------------------------------------------------------- Vast.ai


def test_vast_search_asks_for_hosts_that_can_run_the_image(vast):
    prov = va(vast)
    offers = prov.offers(Requirements(min_vram_gb=24, disk_gb=80))
    ((_, _, q),) = [b for b in vast.bodies if b[:2] == ("POST", "/api/v0/bundles/")]
    assert q["cuda_max_good"] == {"gte": 12.8} and q["external"] == {"eq": False}
    assert q["reliability"]["gte"] >= 0.98 and q["direct_port_count"] == {"gte": 1}
    assert q["allocated_storage"] == 80.0 and q["type"] == "on-demand"
    # 9000: driver too old for CUDA 12.8; 9003: external; 9004: unreliable host
    assert sorted(o.id for o in offers) == ["9001", "9002"]
    by_id = {o.id: o for o in offers}
    assert by_id["9002"].vram_gb >= 24  # gpu_ram 24564 MB is a 24 GB card (vast.py divides by 1000)
    assert by_id["9002"].secure and not by_id["9001"].secure  # a datacenter, not merely "verified"
    assert by_id["9001"].download_usd_per_gb == 0.005
    # the planner's host-memory need: 9001 has 64 GB of RAM, 9002 128 GB
    assert [o.id for o in prov.offers(Requirements(host_ram_gb=100))] == ["9002"]
    assert vast.bodies[-1][2]["cpu_ram"] == {"gte": 100000}
    assert vast.violations == []


def test_vast_onstart_turns_off_auto_tmux():
    assert onstart_script().startswith("touch ~/.no_auto_tmux;")


def test_vast_destroy_that_answers_success_false_is_not_believed(vast):
    prov = va(vast)
    vast.refuse_destroys = 1
    inst = prov.create(Offer("vast", "9001", "RTX 3090", 0.19), InstanceSpec("d", KEY))
    with pytest.raises(ApiError, match="did not destroy"):
        prov.destroy(inst.id)
    assert prov.refresh(inst).state != "gone"
    prov.destroy(inst.id)
    assert prov.refresh(inst).state == "gone"  # 200 {"instances": null}
    assert vast.violations == []


def test_vast_watchdog_recipe_requires_success_and_confirms_with_a_second_delete(vast, monkeypatch):
    prov = va(vast)
    vast.refuse_destroys = 1
    inst = prov.create(Offer("vast", "9001", "RTX 3090", 0.19), InstanceSpec("w", KEY))
    scoped = next(k for k, v in vast.scoped.items() if v == inst.id)
    monkeypatch.setenv("CONTAINER_ID", inst.id)
    monkeypatch.setenv("CONTAINER_API_KEY", scoped)
    recipe = prov.watchdog_config(inst)["destroy"]
    assert run_recipe(recipe, timeout=10) is False  # 200 success:false: the instance still bills
    assert not vast.instances[inst.id].deleted
    assert run_recipe(recipe, timeout=10) is True
    assert vast.instances[inst.id].deleted_by == "container key"
    assert vast.violations == []


def test_vast_run_waits_for_the_late_key_and_goes_direct(sshd_factory, remote_root, tmp_path):
    fake = VastFake(sshd_factory, remote_root, key_delay_s=3.0)
    try:
        summary, _ = run(tmp_path, va(fake))
        assert summary.state == "done"
        assert fake.created_from == [9001]  # never the cheaper host whose CUDA is too old
        (inst,) = fake.instances.values()
        assert inst.proxy.connections == 0  # direct public_ipaddr:HostPort, not the proxy
        assert fake.live() == [] and fake.violations == []
    finally:
        fake.close()


def test_vast_falls_back_to_the_proxy_when_direct_ssh_is_silent(sshd_factory, remote_root, tmp_path):
    fake = VastFake(sshd_factory, remote_root, key_delay_s=0.2, direct_blocked=True)
    try:
        said: list[str] = []
        summary, _ = run(tmp_path, va(fake), said, direct_ssh_s=1.0)
        assert summary.state == "done"
        (inst,) = fake.instances.values()
        assert inst.proxy.connections > 0
        assert any("trying localhost:" in m for m in said)
        assert fake.violations == []
    finally:
        fake.close()


def test_vast_slow_image_pull_extends_the_deadline_and_says_what_it_cost(sshd_factory, remote_root, tmp_path):
    fake = VastFake(sshd_factory, remote_root, key_delay_s=0.2, pull_s=4.0)
    try:
        said: list[str] = []
        summary, _ = run(tmp_path, va(fake), said, ready_deadline_s=2.0, pull_extension_s=60.0,
                         progress_every_s=1.0)
        assert summary.state == "done"
        assert fake.created_from == [9001]  # one pull, not one per offer
        assert any("image pull" in m and "$" in m for m in said)
    finally:
        fake.close()


def test_vast_key_that_never_works_fails_within_the_auth_grace(sshd_factory, remote_root, tmp_path):
    fake = VastFake(sshd_factory, remote_root, key_delay_s=3600.0)
    try:
        with pytest.raises(AuthRefused):
            run(tmp_path, va(fake), auth_grace_s=2.0)
        assert fake.live() == []
        assert Ledger().instances(live_only=True) == []
    finally:
        fake.close()


# ----------------------------------------------------------------------------- prices and images


def test_vast_bandwidth_is_in_the_dollars_per_job():
    from lorapod.compute.offers import planned_job, rank_by_job_cost

    spec = load_spec(Path(__file__).resolve().parents[1] / "examples" / "sdxl-object-lora.yaml")
    dear = Offer("vast", "dear", "RTX 4090", 0.31, 24, download_usd_per_gb=0.5, upload_usd_per_gb=0.5)
    cheap = Offer("vast", "cheap", "RTX 4090", 0.31, 24, download_usd_per_gb=0.0, upload_usd_per_gb=0.0)
    ranked = rank_by_job_cost(spec, planned_job(spec), "vast", [dear, cheap])
    assert [r.offer.id for r in ranked] == ["cheap", "dear"]
    assert ranked[1].estimate.usd_total > ranked[0].estimate.usd_total


def test_default_images_record_their_facts():
    from lorapod.catalog.images import DEFAULTS, KNOWN, image_cuda

    for provider, name in DEFAULTS.items():
        img = KNOWN[name]
        assert img.rsync and img.python_path and img.source, provider
    assert KNOWN[DEFAULTS["runpod"]].reads_public_key  # RunPod's REST starts no SSH itself
    assert image_cuda("runpod/pytorch:1.0.2-cu1290-torch280-ubuntu2204") == "12.9"
    assert image_cuda("pytorch/pytorch:2.9.0-cuda13.0-cudnn9-devel") == "13.0"
    assert image_cuda("me/mine:latest") is None


def test_a_catalogued_default_image_runs_its_own_interpreter(tmp_path):
    """runpod/pytorch 1.0.x: torch is in `python` (3.12); `python3` is Ubuntu's 3.10 without it."""
    from lorapod.catalog.images import DEFAULTS
    from lorapod.compute import hostfacts
    from lorapod.compute.bootstrap import bootstrap_for
    from lorapod.compute.provider import ProviderBase
    from lorapod.compute.remote import Bootstrap

    class Prov(ProviderBase):
        image = DEFAULTS["runpod"]

    spec = load_spec(make_spec(tmp_path))
    boot = bootstrap_for(Bootstrap(), Prov(), spec)
    assert (boot.python, boot.image_python) == ("auto", "/usr/local/bin/python")
    facts = hostfacts.HostFacts(path="/usr/bin:/bin", pid1_path="")
    assert hostfacts.candidates(facts, None, recorded=boot.image_python)[0][0] == "/usr/local/bin/python"
    mine = bootstrap_for(Bootstrap(python="/opt/mine/python"), Prov(), spec)
    assert (mine.python, mine.image_python) == ("/opt/mine/python", "")


def test_vast_fake_takes_env_as_vast_py_sends_it(vast):
    """Erratum C.4: the document types create `env` as a Docker-flag string; vast.py sends a dict."""
    api = VastApi(vast.account_key, base_url=vast.url, backoff_s=0.01)
    api.create_instance(9001, {"image": DEFAULTS_VAST, "label": "env", "disk": 20.0, "env": {"TZ": "UTC"}})
    assert vast.violations == []


DEFAULTS_VAST = "vastai/pytorch:cuda-12.8.1-auto"


def test_a_refused_key_on_your_own_host_is_said_at_once(sshd, tmp_path):
    """The late-key grace is Vast.ai's (it declares key_arrives_late); on ssh:// a wrong key is yours to fix."""
    import time

    from lorapod.compute.ssh import SSHProvider

    from .conftest_ssh import keygen

    stranger = keygen(tmp_path / "stranger")
    prov = SSHProvider.from_kwargs(target=sshd.target, identity=stranger)
    t0 = time.monotonic()
    with pytest.raises(AuthRefused):
        run(tmp_path, prov, identity=stranger, auth_grace_s=120.0)
    assert time.monotonic() - t0 < 30


def test_vast_offer_price_is_the_price_of_the_instance_created(vast):
    """The search prices 8 GB of disk unless told (allocated_storage); the instance bills its disk."""
    prov = va(vast)
    (offer,) = [o for o in prov.offers(Requirements(disk_gb=200)) if o.id == "9001"]
    inst = prov.create(offer, InstanceSpec("price", KEY, disk_gb=200))
    assert prov.refresh(inst).usd_per_hour == pytest.approx(offer.usd_per_hour)


def test_the_ledger_bills_at_the_instances_price_not_the_offers(sshd_factory, remote_root, tmp_path):
    from dataclasses import replace

    class Undersold(VastProvider):  # an offer that under-states what the instance bills
        def offers(self, req):
            return [replace(o, usd_per_hour=o.usd_per_hour / 2) for o in super().offers(req)]

    fake = VastFake(sshd_factory, remote_root, key_delay_s=0.2)
    try:
        said: list[str] = []
        summary, ledger = run(tmp_path, Undersold(VastApi(fake.account_key, base_url=fake.url, backoff_s=0.05,
                                                          timeout=10)), said)
        assert summary.state == "done"
        (row,) = ledger.instances()
        (inst,) = fake.instances.values()
        assert row.usd_per_hour == pytest.approx(inst.usd_per_hour)
        assert any("the caps count the billed price" in m for m in said)
    finally:
        fake.close()
