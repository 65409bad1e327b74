"""The job spec: YAML in, dotted overrides, one readable error per problem."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from lorapod.errors import SpecError
from lorapod.spec import load_spec, redact

BASE = {"model": {"id": "org/model"}, "data": {"path": "chats.jsonl"}}


def write(tmp_path, raw):
    p = tmp_path / "job.yaml"
    p.write_text(yaml.safe_dump(raw))
    return p


def test_defaults_and_relative_paths(tmp_path):
    spec = load_spec(write(tmp_path, BASE))
    assert spec.method.type == "lora" and spec.method.target_modules == "all-linear"
    assert spec.data.path == str(tmp_path / "chats.jsonl")
    assert spec.output.name == "job"
    assert not spec.is_image


def test_overrides_are_typed_yaml_values(tmp_path):
    spec = load_spec(write(tmp_path, BASE), ["train.learning_rate=1e-4", "data.packing=false",
                                              "method.target_modules=[q_proj, v_proj]", "train.max_steps=7"])
    assert spec.train.learning_rate == 1e-4
    assert spec.data.packing is False
    assert spec.method.target_modules == ["q_proj", "v_proj"]
    assert spec.train.max_steps == 7


def test_unknown_key_names_the_key_and_the_closest_one(tmp_path):
    raw = {**BASE, "train": {"learning_rte": 1e-4}}
    with pytest.raises(SpecError) as exc:
        load_spec(write(tmp_path, raw))
    msg = str(exc.value)
    assert "unknown key 'train.learning_rte'" in msg
    assert "did you mean 'train.learning_rate'" in msg


def test_bad_value_names_key_value_and_allowed(tmp_path):
    with pytest.raises(SpecError) as exc:
        load_spec(write(tmp_path, BASE), ["train.scheduler=cosine_restarts", "train.micro_batch_size=0"])
    msg = str(exc.value)
    assert "train.scheduler = 'cosine_restarts'" in msg
    assert "cosine | linear | constant | constant_with_warmup" in msg
    assert "train.micro_batch_size = 0" in msg
    assert "2 problem(s)" in msg


def test_missing_required_and_bad_override_syntax(tmp_path):
    with pytest.raises(SpecError, match="'model' is required"):
        load_spec(write(tmp_path, {"data": {"path": "x"}}))
    with pytest.raises(SpecError, match=r"dotted\.key=value"):
        load_spec(write(tmp_path, BASE), ["train.learning_rate"])
    with pytest.raises(SpecError, match="does not exist"):
        load_spec(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: [unclosed")
    with pytest.raises(SpecError, match="not valid YAML"):
        load_spec(bad)


def test_resolved_spec_never_carries_secrets(tmp_path):
    spec = load_spec(write(tmp_path, BASE))
    text = spec.to_yaml()
    assert "hf_" not in text
    assert redact({"hf_token": "hf_abcdefghijklmnopqrstuvwxyz", "x": ["hf_abcdefghijklmnopqrstuvwxyz12"], "lr": 1}) == {
        "hf_token": "<redacted>", "x": ["<redacted>"], "lr": 1,
    }


def test_examples_load():
    from pathlib import Path

    root = Path(__file__).resolve().parents[1] / "examples"
    for name in ("demo.yaml", "llm-chat-lora.yaml"):
        spec = load_spec(root / name)
        assert spec.model.family == "llm"


def test_relocated_points_at_copies_of_every_local_input(tmp_path):
    """What `lorapod run` uploads and the SkyPilot workdir stages: every data file, the
    validation file, a base model on this disk and a prompts file, each under its own index."""
    for name in ("a.jsonl", "b.jsonl", "val.jsonl", "prompts.txt"):
        (tmp_path / name).write_text("x\n")
    (tmp_path / "base").mkdir()
    spec = load_spec(raw={"model": {"id": str(tmp_path / "base"), "family": "llm"},
                          "data": {"path": [str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl")],
                                   "val_path": str(tmp_path / "val.jsonl")},
                          "samples": {"prompts": str(tmp_path / "prompts.txt")}})
    seen = []

    def put(path, i):
        seen.append((Path(path).name, i))
        return f"data/{i}-{Path(path).name}"

    out = spec.relocated(put)
    assert seen == [("a.jsonl", 0), ("b.jsonl", 1), ("val.jsonl", 2), ("base", 3), ("prompts.txt", 4)]
    assert out.data.path == ["data/0-a.jsonl", "data/1-b.jsonl"] and out.data.val_path == "data/2-val.jsonl"
    assert out.model.id == "data/3-base" and out.samples.prompts == "data/4-prompts.txt"
    assert spec.data.path == [str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl")]  # the original is untouched
    hub = load_spec(raw={"model": {"id": "meta-llama/Llama-3.1-8B"}, "data": {"path": str(tmp_path / "a.jsonl")},
                         "samples": {"prompts": ["a prompt"]}})
    assert hub.relocated(put).model.id == "meta-llama/Llama-3.1-8B"  # a hub id and inline prompts stay


def test_skypilot_workdir_holds_copies_of_the_inputs(tmp_path):
    from lorapod.compute.skypilot import stage

    (tmp_path / "train.jsonl").write_text("{}\n")
    (tmp_path / "prompts.txt").write_text("a prompt\n")
    spec = load_spec(raw={"model": {"id": "meta-llama/Llama-3.1-8B"}, "data": {"path": str(tmp_path / "train.jsonl")},
                          "samples": {"prompts": str(tmp_path / "prompts.txt")}})
    wheel = tmp_path / "lorapod-0.1.0-py3-none-any.whl"
    wheel.write_bytes(b"PK")
    staged = stage(spec, tmp_path / "work", wheel)
    assert staged.data.path == "data/0-train.jsonl" and staged.samples.prompts == "data/3-prompts.txt"
    assert (tmp_path / "work" / "data/3-prompts.txt").read_text() == "a prompt\n"
    assert (tmp_path / "work" / wheel.name).is_file() and (tmp_path / "work" / "spec.yaml").is_file()
