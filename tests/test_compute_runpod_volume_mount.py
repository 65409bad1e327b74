"""A run with a RunPod network volume, end to end on the loopback fake: the volume is created once
in a datacenter that has the GPU, the pod is created there with it attached, and the second
session of the same spec finds the model in the cache on the volume (no download, shown in the
phases)."""

from __future__ import annotations

import json

import pytest

from lorapod.compute.runpod.api import RunPodApi
from lorapod.compute.runpod.provider import RunPodProvider
from lorapod.compute.runpod.volume_mount import pick_datacenter
from lorapod.compute.runpod.volumes import NetworkVolumes
from lorapod.compute.session import run_remote
from lorapod.errors import LorapodError
from lorapod.spec import load_spec
from lorapod.store.ledger import Ledger
from lorapod.store.phases import job_phases

from .fakes.runpod_volumes_fake import RunPodWithVolumesFake
from .remote_helpers import fake_command, fast_options, make_spec

DOWNLOAD_S = 2.0


@pytest.fixture
def fake(sshd_factory, remote_root, tmp_path_factory, tmp_path, monkeypatch):
    f = RunPodWithVolumesFake(sshd_factory, remote_root, tmp_path_factory.mktemp("volumes"))
    monkeypatch.setenv("LORAPOD_RUNPOD_VOLUME_MOUNT", str(tmp_path / "workspace"))
    yield f
    f.close()
    assert f.violations == [], f.violations


def provider(fake) -> RunPodProvider:
    return RunPodProvider(RunPodApi(fake.account_key, base_url=fake.url, graphql_url=fake.graphql_url,
                                    backoff_s=0.05, timeout=10))


def session(fake, spec_path, notes: list[str]):
    spec = load_spec(spec_path)
    prov = provider(fake)
    mount = prov.attach_volume(spec, spec.compute.volume, say=notes.append)
    opts = fast_options(job_command=fake_command(0.05, extra=("--hf-model", "org/base-model",
                                                              "--download-s", str(DOWNLOAD_S))))
    ledger = Ledger()
    summary = run_remote(spec, prov, "runpod", opts, ledger, str(spec_path), say=lambda m: None)
    return summary, mount, job_phases(ledger, summary.job_id)


def test_second_session_with_the_volume_downloads_nothing(fake, tmp_path, remote_root):
    spec_path = make_spec(tmp_path, volume="lora-cache")
    notes: list[str] = []
    first, mount1, phases1 = session(fake, spec_path, notes)
    assert first.state == "done", first.message
    # created once, where the cheapest Secure Cloud GPU (RTX 3090) is in stock: US-TX-3
    (vol,) = fake.volumes.values()
    assert (vol["name"], vol["dataCenterId"]) == ("lora-cache", "US-TX-3") and mount1.created
    body = fake.pod_bodies[-1]
    assert body["networkVolumeId"] == vol["id"] and body["dataCenterIds"] == ["US-TX-3"]
    assert body["cloudType"] == "SECURE" and body["volumeMountPath"] == str(tmp_path / "workspace")
    fetch1 = json.loads((first.run_dir / "model-fetch.json").read_text())
    assert fetch1["downloaded"] is True
    assert fetch1["hf_hub_cache"] == f"{tmp_path}/workspace/lorapod/huggingface/hub"
    assert fetch1["lorapod_cache_dir"] == f"{tmp_path}/workspace/lorapod/cache"
    # the pod is gone, its work folder too; the volume's files are not
    assert fake.live() == [] and list(remote_root.iterdir()) == []
    assert list((fake.volume_root / vol["id"] / "lorapod" / "huggingface" / "hub").iterdir())

    second, mount2, phases2 = session(fake, spec_path, notes)
    assert second.state == "done", second.message
    assert len(fake.volumes) == 1 and not mount2.created and mount2.volume.id == vol["id"]
    assert fake.pod_bodies[-1]["networkVolumeId"] == vol["id"]
    assert json.loads((second.run_dir / "model-fetch.json").read_text())["downloaded"] is False
    # the phases show it: job start to first step lost the download
    print(f"first session phases {phases1}\nsecond session phases {phases2}")
    assert phases1["first step"] >= DOWNLOAD_S
    assert phases2["first step"] < phases1["first step"] - DOWNLOAD_S * 0.75, (phases1, phases2)
    assert any("created network volume lora-cache" in n for n in notes)
    assert any(n.startswith("using network volume lora-cache") for n in notes)


def test_existing_volume_limits_offers_to_its_datacenter(fake, tmp_path):
    vol = NetworkVolumes(provider(fake).api).create("models", 50, "EU-RO-1")  # EU-RO-1 has only RTX 4090s
    spec = load_spec(make_spec(tmp_path, volume="models"))
    prov = provider(fake)
    mount = prov.attach_volume(spec, "models", say=lambda m: None)
    assert mount.volume.id == vol.id and not mount.created and prov.volume is mount
    from lorapod.compute.offers import choose_offers, planned_job

    offers = [r.offer for r in choose_offers(spec, prov, job=planned_job(spec))]
    assert {(o.gpu_name, o.extra["cloud_type"]) for o in offers} == {("RTX 4090", "SECURE")}
    assert mount.create_fields()["dataCenterIds"] == ["EU-RO-1"]


def test_two_volumes_with_one_name_are_refused(fake, tmp_path):
    api = provider(fake).api
    NetworkVolumes(api).create("dup", 10, "EU-RO-1")
    NetworkVolumes(api).create("dup", 10, "US-TX-3")  # RunPod allows it: names need not be unique
    with pytest.raises(LorapodError, match="2 RunPod network volumes are named 'dup'"):
        provider(fake).attach_volume(load_spec(make_spec(tmp_path, volume="dup")), "dup", say=lambda m: None)


def test_pod_without_the_volumes_datacenter_is_refused_by_the_fake(fake):
    vid = NetworkVolumes(provider(fake).api).create("v", 10, "EU-RO-1").id
    from lorapod.compute.httpapi import ApiError

    with pytest.raises(ApiError):
        provider(fake).api.create_pod({"name": "x", "imageName": "img", "gpuTypeIds": ["NVIDIA GeForce RTX 4090"],
                                       "cloudType": "SECURE", "networkVolumeId": vid, "dataCenterIds": ["US-TX-3"]})
    assert fake.live() == []


def test_pick_datacenter_prefers_the_best_gpu_then_the_most_fallbacks():
    stock = {"A": {"g2"}, "B": {"g1"}, "C": {"g1", "g2"}}
    assert pick_datacenter(["g1", "g2"], stock) == ("C", "g1")
    assert pick_datacenter(["g3"], stock) is None


def test_run_with_a_volume_on_vast_is_refused_before_renting(tmp_path, capsys, monkeypatch):
    from .cli_helpers import run_cli

    monkeypatch.setenv("VAST_API_KEY", "k")
    monkeypatch.setenv("LORAPOD_VAST_URL", "http://127.0.0.1:9")  # nothing may be called
    code, _out, err = run_cli(["run", str(make_spec(tmp_path)), "--on", "vast", "--volume", "models", "--force"], capsys)
    assert code != 0 and "compute.volume is not supported on vast" in err and "one physical machine" in err


class _Recorder:
    """A transport that records what lorapod asks the instance to run (nothing runs)."""

    def __init__(self) -> None:
        self.commands: list[str] = []

    def run(self, command, input=None, timeout=60.0, check=True):
        import subprocess

        self.commands.append(command)
        return subprocess.CompletedProcess(command, 0, b'{"ok": true, "python": "py", "how": "reused", "installed": 0}\n', b"")


def test_the_environment_cache_and_the_job_caches_go_under_the_volume():
    import shlex

    from lorapod.compute.remote import Bootstrap, RemoteWork

    t = _Recorder()
    work = RemoteWork(t, "job1", root=".lorapod-work", cache_root="/workspace/lorapod")
    assert work.environment(Bootstrap(python="python3")).how == "reused"
    request = json.loads(shlex.split(t.commands[0])[-1])
    assert request["envs"] == "/workspace/lorapod/.envs"  # envsetup builds or reuses it there
    work.start_job({}, ["python3", "-m", "lorapod", "train", "spec.yaml"])
    assert "env HF_HOME=/workspace/lorapod/huggingface LORAPOD_CACHE_DIR=/workspace/lorapod/cache python3" \
        in t.commands[-1]
    assert work.dir == ".lorapod-work/job1"  # the work folder stays on the container disk


def test_the_engines_latent_cache_follows_lorapod_cache_dir(monkeypatch, tmp_path):
    from lorapod.engine.diffusion.cache import default_cache_root

    monkeypatch.setenv("LORAPOD_CACHE_DIR", str(tmp_path / "vol"))
    assert default_cache_root() == tmp_path / "vol" / "diffusion"


def test_a_sweep_does_not_silently_drop_the_volume(tmp_path, capsys):
    from .cli_helpers import run_cli

    code, _out, err = run_cli(["sweep", str(make_spec(tmp_path, volume="models")), "--grid",
                               "train.learning_rate=1e-4,2e-4", "--on", "runpod"], capsys)
    assert code != 0 and "sweeps do not mount compute.volume" in err
