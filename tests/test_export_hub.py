"""``lorapod export RUN --to hub``: huggingface_hub's real client against a loopback Hub (tests/fakes/hf_hub_fake.py)."""

from __future__ import annotations

import json

import pytest
import yaml

from lorapod.engine.llm import train_llm
from lorapod.errors import ExportError
from lorapod.export.card import render
from lorapod.rundir import RunDir
from lorapod.spec import load_spec

from .cli_helpers import run_cli
from .fakes.hf_hub_fake import FakeHub
from .llm_fixtures import make_model_dir, spec_dict, write_data

hub_mod = pytest.importorskip("huggingface_hub")
TOKEN = "hf_" + "x" * 34


@pytest.fixture
def hub(monkeypatch):
    from huggingface_hub import constants

    fake = FakeHub(TOKEN)
    monkeypatch.setenv("HF_ENDPOINT", fake.url)  # huggingface_hub honours it; lorapod reads it at call time
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)  # tests/conftest.py turns the hub off elsewhere
    monkeypatch.setattr(constants, "HF_HUB_DISABLE_XET", True)  # the fake serves the LFS path, not Xet
    yield fake
    fake.close()


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp("hubrun")
    model_dir = make_model_dir(root)
    tr, va = write_data(root)
    raw = spec_dict(model_dir, tr, va, root / "runs", max_steps=4)
    raw["save"] = {"every_steps": 2, "every_epochs": None, "keep_last": 2}
    spec = load_spec(raw=raw)
    run = RunDir.create(spec.output.dir, "fruit")
    run.write_spec(spec)
    train_llm(spec, run, device="cpu", show_progress=False, log=lambda m: None)
    return run


def test_export_to_hub_uploads_the_adapter_and_a_card(hub, trained, capsys):
    code, out, err = run_cli(["export", str(trained.root), "--to", "hub", "--repo", "me/fruit-lora", "--private"], capsys)
    assert code == 0, err
    repo = hub.repos["me/fruit-lora"]
    assert repo.private
    assert {"README.md", "adapter_config.json", "adapter_model.safetensors"} <= set(repo.files)
    assert "adapter_model.safetensors" in hub.lfs_paths  # binary weights went through LFS, as the Hub wants
    assert json.loads(repo.files["adapter_config.json"])["r"] == 8
    # remembered on this machine, not in the run folder (a host writes that): `lorapod deploy` serves it
    from lorapod.deploy.serverless import published_repo

    assert published_repo(trained.root, merged=False) == "me/fruit-lora" and published_repo(trained.root, True) is None
    assert not (trained.root / "published.json").exists()
    card = repo.files["README.md"].decode()
    meta = yaml.safe_load(card.split("---")[1])
    assert "peft" in meta["tags"] and meta["library_name"] == "peft"
    for heading in ("## Training settings", "## Evaluation", "## Files"):
        assert heading in card
    assert "| val_loss |" in card  # base vs tuned from metrics.jsonl
    assert "PeftModel.from_pretrained" in card
    assert "me/fruit-lora" in out
    # a second upload of the same files: huggingface_hub's preupload sees the oids and skips them
    code, _out, err = run_cli(["export", str(trained.root), "--to", "hub", "--repo", "me/fruit-lora"], capsys)
    assert code == 0, err
    assert len(repo.commits) == 1


def test_no_token_and_a_bad_repo_are_one_clear_error(hub, trained, monkeypatch, tmp_path, capsys):
    monkeypatch.delenv("HF_TOKEN")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))  # no stored login either
    code, _out, err = run_cli(["export", str(trained.root), "--to", "hub", "--repo", "me/x"], capsys)
    assert code != 0 and "HF_TOKEN" in err and "Traceback" not in err
    monkeypatch.setenv("HF_TOKEN", "hf_wrong" + "y" * 30)
    code, _out, err = run_cli(["export", str(trained.root), "--to", "hub", "--repo", "me/x"], capsys)
    assert code != 0 and "HTTP 401" in err and "hf_wrong" not in err
    code, _out, err = run_cli(["export", str(trained.root), "--to", "hub", "--repo", "not a repo"], capsys)
    assert code != 0 and "not a Hub repo id" in err
    assert "me/x" not in hub.repos


def test_an_unreachable_hub_is_one_clear_line_and_no_export_is_logged(hub, trained, monkeypatch, capsys):
    """Issue 48, F1: a token and no Hub to reach (a loopback port nothing listens on: connection
    refused, as a network down or a firewall says it) is one line naming the Hub, not a traceback;
    and the staged files of the failed upload are not logged as exports of the run (F23)."""
    import socket

    with socket.socket() as s:  # a free port, closed again: nothing answers there
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
    events = trained.root / "events.log"
    before = events.read_text() if events.exists() else ""
    code, _out, err = run_cli(["export", str(trained.root), "--to", "hub", "--repo", "me/offline"], capsys)
    assert code != 0 and "Traceback" not in err, err
    said = " ".join(err.split())
    assert f"could not reach the Hugging Face Hub at http://127.0.0.1:{port}" in said and "nothing was uploaded" in said
    assert "HF_ENDPOINT" in said  # the hint names what this user set
    after = events.read_text() if events.exists() else ""
    assert "export " not in after[len(before):] and "published" not in after[len(before):]


def test_a_flux_dev_card_carries_the_non_commercial_licence_and_says_gated(tmp_path):
    spec = load_spec(raw={"model": {"id": "black-forest-labs/FLUX.1-dev", "family": "flux1", "variant": "dev"},
                          "data": {"path": str(tmp_path), "format": "images", "trigger": "zxq_mug"}})
    card = render(spec, repo_id="me/mug", what="adapter", files=[], metrics=[], samples=["samples/a.png"],
                  lorapod_version="0.1.0")
    meta = yaml.safe_load(card.split("---")[1])
    assert meta["license"] == "other" and meta["license_name"] == "flux-1-dev-non-commercial-license"
    assert meta["base_model"] == "black-forest-labs/FLUX.1-dev" and meta["instance_prompt"] == "zxq_mug"
    assert "**Non-commercial.**" in card and "**gated**" in card and "`zxq_mug`" in card
    assert "![a](samples/a.png)" in card
    # and the Hub's metadata check (the fake's validate-yaml) accepts it
    fake = FakeHub(TOKEN)
    try:
        status, body = fake._validate_yaml({"content": card, "repoType": "model"})
    finally:
        fake.close()
    assert status == 200, body


def test_the_fake_hub_rejects_what_the_hub_rejects():
    fake = FakeHub(TOKEN)
    try:
        assert fake._validate_yaml({"content": "---\nlicense: flux-dev\n---\n"})[0] == 400
        assert fake._validate_yaml({"content": "---\nlicense: other\n---\n"})[0] == 400
        assert fake._mode("x.safetensors", 10, b"abc") == "lfs"
        assert fake._mode("README.md", 10, b"# hi") == "regular"
        assert fake._mode("blob.dat", 10, b"a\0b") == "lfs"
    finally:
        fake.close()


def test_merged_and_gguf_are_exclusive(trained):
    from lorapod.export.hub import publish

    with pytest.raises(ExportError, match="two different uploads"):
        publish(trained.root, "me/x", merged=True, gguf=True)


def test_only_real_sample_images_under_the_bound_go_and_lorapods_names_choose_them(hub, trained, capsys):
    """A remote run's samples/ is what the host wrote. Before: a file of zeros named as the newest
    sample was uploaded whatever its size (2 GB seen), and a name that sorted last (`zzzz-00.png`)
    chose which samples went."""
    from PIL import Image

    samples = trained.root / "samples"
    samples.mkdir(exist_ok=True)
    made = [samples / n for n in ("step000004-00.png", "step000009-00.png", "step000009-01.png", "zzzz-00.png")]
    try:
        Image.new("RGB", (8, 8), "red").save(made[0])
        with open(made[1], "wb") as fh:  # zeros past the bound (sparse: no disk is spent)
            fh.truncate(25 * 1024 * 1024)  # over MAX_SAMPLE_BYTES (20 MB)
        made[2].write_bytes(b"\0" * 4096)  # small, but no image
        code, _out, err = run_cli(["export", str(trained.root), "--to", "hub", "--repo", "me/fruit-samples"], capsys)
        assert code == 0, err
        sent = {f for f in hub.repos["me/fruit-samples"].files if f.startswith("samples/")}
        assert sent == {"samples/step000004-00.png"}  # the newest step with a real image
        Image.new("RGB", (8, 8), "blue").save(made[3])  # a host-chosen name that sorts last
        code, _out, err = run_cli(["export", str(trained.root), "--to", "hub", "--repo", "me/fruit-samples2"], capsys)
        assert code == 0, err
        assert {f for f in hub.repos["me/fruit-samples2"].files if f.startswith("samples/")} == sent
    finally:
        for p in made:
            p.unlink(missing_ok=True)
