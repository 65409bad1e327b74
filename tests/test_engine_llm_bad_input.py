"""Bad input to the LLM engine: each is one clear LorapodError, never a traceback."""

from __future__ import annotations

import json

import pytest

from lorapod.engine.llm import train_llm
from lorapod.errors import DataError, ModelLoadError
from lorapod.rundir import RunDir
from lorapod.spec import load_spec

from .llm_fixtures import make_model_dir, spec_dict, write_data


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    root = tmp_path_factory.mktemp("bad")
    return root, make_model_dir(root), *write_data(root)


def _train(assets, tmp_path, train_file, **over):
    _root, model_dir, _tr, va = assets
    raw = spec_dict(model_dir, train_file, va, tmp_path / "runs", max_steps=1)
    for k, v in over.items():
        section, key = k.split("__")
        raw.setdefault(section, {})[key] = v
    spec = load_spec(raw=raw)
    run = RunDir.create(spec.output.dir, "t")
    return train_llm(spec, run, device="cpu", show_progress=False, log=lambda m: None)


def test_missing_data_file(assets, tmp_path):
    with pytest.raises(DataError, match="does not exist"):
        _train(assets, tmp_path, tmp_path / "nope.jsonl")


def test_zero_usable_examples(assets, tmp_path):
    f = tmp_path / "empty.jsonl"
    f.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"}]}) + "\n")
    with pytest.raises(DataError, match="no usable chat example"):
        _train(assets, tmp_path, f)


def test_truncated_last_line_is_named_then_skippable(assets, tmp_path):
    _root, _m, tr, _va = assets
    text = tr.read_text()
    f = tmp_path / "cut.jsonl"
    f.write_text(text + '{"messages": [{"role": "user", "con')
    n_lines = text.count("\n") + 1
    with pytest.raises(DataError) as exc:
        _train(assets, tmp_path, f)
    assert f"line {n_lines}" in str(exc.value) and "cut off" in str(exc.value)
    assert "skip_bad_examples" in exc.value.hint
    out = _train(assets, tmp_path, f, data__skip_bad_examples=True)
    assert out.result.state.step == 1


def test_roles_out_of_order(assets, tmp_path):
    f = tmp_path / "order.jsonl"
    good = {"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]}
    bad = {"messages": [{"role": "user", "content": "a"}, {"role": "system", "content": "s"},
                        {"role": "assistant", "content": "b"}]}
    f.write_text(json.dumps(good) + "\n" + json.dumps(bad) + "\n")
    with pytest.raises(DataError, match=r"line 2: system message at turn 1"):
        _train(assets, tmp_path, f)


def test_mixed_formats_refused_with_line(assets, tmp_path):
    f = tmp_path / "mixed.jsonl"
    f.write_text(json.dumps({"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]})
                 + "\n" + json.dumps({"instruction": "a", "input": "", "output": "b"}) + "\n")
    with pytest.raises(DataError, match="line 2 is alpaca"):
        _train(assets, tmp_path, f)


def test_unreachable_model_id_says_how_to_download(assets, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    _root, _m, tr, va = assets
    raw = spec_dict("no-such-org/no-such-model", tr, va, tmp_path / "runs", max_steps=1)
    spec = load_spec(raw=raw)
    with pytest.raises(ModelLoadError) as exc:
        train_llm(spec, RunDir.create(spec.output.dir, "t"), device="cpu", show_progress=False, log=lambda m: None)
    assert "huggingface-cli download no-such-org/no-such-model" in exc.value.hint


def test_sharegpt_and_alpaca_train(assets, tmp_path):
    share = tmp_path / "share.jsonl"
    alpaca = tmp_path / "alpaca.jsonl"
    rows_s, rows_a = [], []
    for i in range(6):
        rows_s.append({"conversations": [{"from": "human", "value": f"What colour is a banana {i}?"},
                                         {"from": "gpt", "value": "The banana is yellow."}]})
        rows_a.append({"instruction": f"What colour is a plum {i}?", "input": "", "output": "The plum is purple."})
    share.write_text("".join(json.dumps(r) + "\n" for r in rows_s))
    alpaca.write_text("".join(json.dumps(r) + "\n" for r in rows_a))
    assert _train(assets, tmp_path, share).result.state.step == 1
    assert _train(assets, tmp_path, alpaca).result.state.step == 1
