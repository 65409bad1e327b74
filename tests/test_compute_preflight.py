"""Pre-flight: every check refuses through the real CLI before a single request reaches the
(fake, OpenAPI-checked) RunPod control plane, so a mistake costs nothing."""

from __future__ import annotations

import json
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import yaml

from lorapod.compute.offers import planned_job
from lorapod.compute.preflight import PreflightError
from lorapod.compute.preflight import preflight as preflight_on
from lorapod.compute.runpod.provider import RunPodProvider
from lorapod.compute.ssh import SSHProvider
from lorapod.spec import load_spec

from .remote_helpers import cli_argv, cli_env, make_spec


def preflight(spec, where: str, **kw):
    """The check as prepare_run calls it: with the provider object and the run's planned job."""
    provider = RunPodProvider(api=object()) if where == "runpod" else SSHProvider("ssh://u@h:22")
    return preflight_on(spec, provider, planned_job(spec), **kw)


class Hub(BaseHTTPRequestHandler):
    """A Hugging Face Hub that knows one model: ``known/model``."""

    def do_GET(self) -> None:
        ok = self.path == "/api/models/known/model"
        body = json.dumps({"id": "known/model", "gated": False} if ok else {"error": "Repository not found"}).encode()
        self.send_response(200 if ok else 404)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a) -> None:
        pass


@pytest.fixture
def hub():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Hub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def spec_with(tmp_path, model: str = "lorapod:tiny-llama", **changes) -> str:
    path = make_spec(tmp_path)
    raw = yaml.safe_load(path.read_text())
    raw["model"]["id"] = model
    for dotted, value in changes.items():
        section, key = dotted.split("__")
        raw.setdefault(section, {})[key] = value
    path.write_text(yaml.safe_dump(raw))
    return str(path)


def run_cli(runpod, spec: str, *extra: str, **env: str) -> subprocess.CompletedProcess:
    environment = cli_env(RUNPOD_API_KEY=runpod.account_key, LORAPOD_RUNPOD_URL=runpod.url,
                          LORAPOD_RUNPOD_GRAPHQL_URL=runpod.graphql_url, **env)
    environment.pop("HF_TOKEN", None)
    return subprocess.run([*cli_argv(), "run", spec, "--on", "runpod", "--max-usd", "1", *extra],
                          capture_output=True, text=True, timeout=120, env=environment)


def refused(proc: subprocess.CompletedProcess, *says: str) -> None:
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    said = " ".join(proc.stderr.split())  # rich wraps long lines
    for text in says:
        assert text in said, proc.stderr


def test_each_check_refuses_before_the_control_plane_hears_anything(runpod, hub, tmp_path):
    offline = {"HF_HUB_OFFLINE": "1"}
    # 1. the data path does not exist
    refused(run_cli(runpod, spec_with(tmp_path / "a", data__path="nowhere.jsonl"), **offline),
            "data path", "nowhere.jsonl does not exist")
    # 2. a model the Hub does not know
    refused(run_cli(runpod, spec_with(tmp_path / "c", model="nobody/no-such-model"), HF_HUB_OFFLINE="0",
                    HF_ENDPOINT=hub), "nobody/no-such-model was not found on the Hugging Face Hub")
    # 3. a disk too small for the model, caches, checkpoints and the environment
    refused(run_cli(runpod, spec_with(tmp_path / "e", model="Qwen/Qwen2.5-14B", compute__disk_gb=20), **offline),
            "compute.disk_gb = 20 is too small", "--set compute.disk_gb=")
    assert runpod.calls == [], runpod.calls  # not even a price query: nothing was rented
    assert runpod.instances == {}


def test_data_errors_and_gated_models_are_refused(tmp_path, monkeypatch):
    """The same function the CLI calls first (checks 1, 3 and 5 above go through the CLI)."""
    monkeypatch.delenv("HF_TOKEN", raising=False)
    offline = {"HF_HUB_OFFLINE": "1"}
    bad = spec_with(tmp_path / "b")
    with open(tmp_path / "b" / "data" / "train.jsonl", "a") as fh:
        fh.write("{not json\n")
    with pytest.raises(PreflightError) as err:
        preflight(load_spec(bad), "runpod", env=offline)
    assert "lorapod data check" in err.value.message and "--force" in (err.value.hint or "")
    gated = load_spec(spec_with(tmp_path / "d", model="meta-llama/Llama-3.1-8B"))
    with pytest.raises(PreflightError) as err:
        preflight(gated, "runpod", env=offline)
    assert "is gated" in err.value.message and "HF_TOKEN" in (err.value.hint or "")
    assert preflight(gated, "ssh", env={**offline, "HF_TOKEN": "hf_x"}).notes == []


def test_preflight_passes_what_it_should(hub, tmp_path):
    env = {"HF_HUB_OFFLINE": "0", "HF_ENDPOINT": hub}
    ok = preflight(load_spec(spec_with(tmp_path / "a", model="known/model")), "runpod", env=env)
    assert ok.notes == [] or all("image" not in n for n in ok.notes)
    big = preflight(load_spec(spec_with(tmp_path / "b", model="Qwen/Qwen2.5-14B", compute__disk_gb=200)),
                    "runpod", env={"HF_HUB_OFFLINE": "1"})
    # Qwen2.5 14B in bf16 is about 29.5 GB to download: the estimate holds it and the environment.
    assert 29.5 * 1.15 < big.disk_needed_gb < 200
    # the same data error goes through with --force, as a note
    bad = spec_with(tmp_path / "c")
    with open(tmp_path / "c" / "data" / "train.jsonl", "a") as fh:
        fh.write("{not json\n")
    forced = preflight(load_spec(bad), "ssh", force=True, env={"HF_HUB_OFFLINE": "1"})
    assert any("--force: going on" in n for n in forced.notes)
