"""The lock read from this machine, the instance-side env set-up's decisions, and the local
provider running with this very interpreter."""

from __future__ import annotations

import importlib.metadata as md
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lorapod.compute import envsetup
from lorapod.compute.bootstrap import (
    ENGINE_MIN_TORCH,
    Lock,
    derive_lock,
    env_request,
    envsetup_source,
    parse_result,
)
from lorapod.errors import LorapodError, RemoteError

from .remote_helpers import cli_argv, cli_env, fake_command_template, make_spec


def test_the_lock_is_this_machines_closure_without_torch():
    llm = derive_lock("llm")
    pins = dict(p.split("==") for p in llm.pins)
    for name in ("transformers", "peft", "accelerate", "safetensors", "pydantic", "typer", "huggingface-hub"):
        assert pins[name] == md.version(name), name
    assert not any(n == "torch" or n.startswith(("nvidia-", "triton")) for n in pins)
    assert "diffusers" not in pins  # the image extra's, not the llm extra's
    assert llm.torch_floor == ENGINE_MIN_TORCH and llm.torch_pin == f"torch=={md.version('torch').split('+')[0]}"
    image = derive_lock("image")
    assert dict(p.split("==") for p in image.pins)["diffusers"] == md.version("diffusers")
    assert set(llm.pins) < set(image.pins) and llm.digest != image.digest
    assert derive_lock("llm").digest == llm.digest  # stable: the env cache key


def test_a_distribution_missing_here_is_refused_before_renting():
    lock = Lock("image", ("a==1",), missing=("diffusers>=0.42",))
    with pytest.raises(LorapodError, match="lacks diffusers") as err:
        env_request(lock, "python3", "/w")
    assert "pip install 'lorapod[image]'" in (err.value.hint or "")


def test_pip_settings_are_passed_on_to_uv(tmp_path, monkeypatch):
    conf = tmp_path / "pip.conf"
    conf.write_text("[global]\nindex-url = https://mirror.example/simple\nextra-index-url = file:///a file:///b\n"
                    "cert = /etc/ca.pem\n")
    for k in list(os.environ):
        if k.startswith(("PIP_", "UV_")) or k == "SSL_CERT_FILE":
            monkeypatch.delenv(k)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("PIP_CONFIG_FILE", str(conf))
    assert envsetup.uv_index_args() == ["--index-url", "https://mirror.example/simple", "--extra-index-url",
                                        "file:///a", "--extra-index-url", "file:///b",
                                        "--index-strategy", "unsafe-best-match"]
    assert envsetup.uv_env() == {"SSL_CERT_FILE": "/etc/ca.pem"}
    monkeypatch.setenv("PIP_INDEX_URL", "http://env.example/simple")  # the environment beats the file
    assert envsetup.uv_index_args()[:2] == ["--index-url", "http://env.example/simple"]
    assert envsetup.index_url() == "http://env.example/simple + file:///a + file:///b"
    monkeypatch.setenv("UV_INDEX_URL", "http://uv.example/simple")  # uv's own settings: left to uv
    assert envsetup.uv_index_args() == [] and envsetup.uv_env() == {}
    monkeypatch.delenv("UV_INDEX_URL")
    monkeypatch.delenv("PIP_INDEX_URL")
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)  # pip's rule: no configuration files at all
    assert envsetup.pip_settings() == {}


def test_the_first_package_the_installer_names_is_reported():
    out = "Because there is no version of accelerate==1.0 and you require tokenizers==2 ... peft"
    assert envsetup.culprit(out, ["peft==1", "tokenizers==2", "accelerate==1.0"]) == "accelerate==1.0"
    assert envsetup.culprit("nothing useful", ["peft==1"]) is None
    assert envsetup.release("2.13.0+cpu") == (2, 13, 0) and envsetup.release("2.6.0rc1") == (2, 6, 0)
    assert envsetup.release("2.13.0") > envsetup.release("2.6")
    failed = json.loads(envsetup.fail("could not install x from https://bob:s3cret@mirror/simple", "x",
                                      "https://bob:s3cret@mirror/simple", "GET https://bob:s3cret@mirror/simple/x/"))
    assert "s3cret" not in json.dumps(failed) and failed["index"] == "https://***@mirror/simple"


def test_an_interpreter_that_has_everything_installs_nothing(tmp_path):
    """envsetup under this very interpreter (which has lorapod[llm]): the image case."""
    request = env_request(derive_lock("llm"), sys.executable, str(tmp_path))
    proc = subprocess.run([sys.executable, "-", json.dumps(request)], input=envsetup_source(),
                          capture_output=True, timeout=120)
    result = parse_result(proc.stdout.decode(), proc.stderr.decode(), sys.executable)
    assert (result.how, result.python, result.installed) == ("image", sys.executable, 0)
    assert result.torch == md.version("torch")
    assert not (tmp_path / ".envs").exists() or not any((tmp_path / ".envs").iterdir())


def test_an_interpreter_too_old_is_named():
    with pytest.raises(RemoteError, match="could not run lorapod's environment set-up") as err:
        parse_result("", "SyntaxError: invalid syntax", "/usr/bin/python3.8")
    assert "--python" in (err.value.hint or "")
    failed = json.dumps({"ok": False, "error": "Python 3.10.12 is too old", "kind": "python", "package": None})
    with pytest.raises(RemoteError, match=r"3\.10\.12 is too old") as err:
        parse_result(failed, "", "python3")
    assert "--python" in (err.value.hint or "") and "index" not in (err.value.hint or "")


def test_local_runs_with_this_interpreter_not_python3_from_path(tmp_path):
    """PATH's python3 here is a bare system Python: the local provider must not use it."""
    spec = make_spec(tmp_path, max_steps=4, every=2)
    env = cli_env(LORAPOD_JOB_COMMAND=fake_command_template(0.05), PATH="/usr/bin:/bin")
    proc = subprocess.run([*cli_argv(), "run", str(spec), "--on", "local", "--json", "--poll-s", "0.2",
                           "--pull-every-s", "0.5", "--watchdog-poll-s", "0.3"],
                          capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = json.loads(proc.stdout)
    assert summary["state"] == "done" and summary["last_step"] == 4
    events = (Path(summary["run_dir"]) / "remote-events.log").read_text()
    assert "phase environment: " in events and f"{sys.executable} as it is; installed nothing" in events


def test_plan_knows_each_default_images_torch():
    from lorapod.catalog.images import DEFAULTS, KNOWN, image_note
    from lorapod.compute.runpod.provider import RunPodProvider
    from lorapod.compute.vast.provider import VastProvider

    assert RunPodProvider.__init__.__defaults__[1] == DEFAULTS["runpod"]  # type: ignore[index]
    assert VastProvider.__init__.__defaults__[1] == DEFAULTS["vast"]  # type: ignore[index]
    for image in DEFAULTS.values():
        assert envsetup.release(KNOWN[image].torch) >= envsetup.release(ENGINE_MIN_TORCH)
        assert image_note(image, ENGINE_MIN_TORCH) is None
    old = image_note("runpod/pytorch:2.4.0-py3.11-cuda12.4.1-devel-ubuntu22.04", ENGINE_MIN_TORCH)
    assert old is not None and "ships torch 2.4.0" in old and f">= {ENGINE_MIN_TORCH}" in old
    assert "not in lorapod's catalog" in (image_note("me/mine:1", ENGINE_MIN_TORCH) or "")
