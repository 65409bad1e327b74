"""LLM exports of a tiny trained Llama run: PEFT, merged, llama.cpp GGUF (adapter and model),
Ollama; and every bad input as one clear error that names the file, with nothing overwritten."""

from __future__ import annotations

import re
import shutil

import numpy as np
import pytest
import torch

from lorapod.engine.llm import train_llm
from lorapod.errors import ExportError
from lorapod.export import gguf
from lorapod.export.targets import export_run
from lorapod.rundir import RunDir
from lorapod.spec import load_spec

from .llm_fixtures import make_model_dir, spec_dict, write_data

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp("llmexp")
    model_dir = make_model_dir(root, hidden=32, layers=2)
    tr, va = write_data(root)
    raw = spec_dict(model_dir, tr, va, root / "runs", max_steps=4, learning_rate=2e-2)
    raw["save"] = {"every_steps": 2, "keep_last": 5}
    raw["method"]["target_modules"] = "all-linear"
    spec = load_spec(raw=raw)
    run = RunDir.create(spec.output.dir, "t")
    run.write_spec(spec)
    train_llm(spec, run, device="cpu", show_progress=False, log=lambda m: None)
    return {"run": run.root, "base": model_dir, "root": root}


def _logits(model, n=16):
    ids = torch.arange(3, 3 + n).unsqueeze(0)
    with torch.no_grad():
        return model(input_ids=ids).logits.float()


def _peft(base_dir, adapter_dir):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    return PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(str(base_dir)), str(adapter_dir)).eval()


def test_peft_export_loads_and_equals_the_checkpoint(trained, tmp_path):
    done = export_run(trained["run"], "peft", checkpoint=4, out=tmp_path / "p")
    assert done.files == ["adapter_config.json", "adapter_model.safetensors"]
    want = _logits(_peft(trained["base"], trained["run"] / "adapter"))  # PEFT's own save at the end (step 4)
    got = _logits(_peft(trained["base"], tmp_path / "p"))
    assert torch.allclose(got, want, atol=1e-5)
    other = _logits(_peft(trained["base"], export_run(trained["run"], "peft", checkpoint=2, out=tmp_path / "q").out))
    assert not torch.allclose(other, want, atol=1e-4)  # --checkpoint picks a different step


def test_merged_equals_base_plus_adapter_in_the_base_dtype(trained, tmp_path):
    from transformers import AutoModelForCausalLM

    export_run(trained["run"], "merged", out=tmp_path / "m")
    merged = AutoModelForCausalLM.from_pretrained(str(tmp_path / "m"))
    assert next(merged.parameters()).dtype == torch.float32
    assert (tmp_path / "m" / "tokenizer.json").is_file()
    want = _logits(_peft(trained["base"], trained["run"] / "adapter"))
    base = _logits(AutoModelForCausalLM.from_pretrained(str(trained["base"])))
    got = _logits(merged)
    assert (want - base).abs().max() > 1e-2
    assert torch.allclose(got, want, atol=1e-4)


def test_exported_and_trained_weights_are_readable_as_the_umask_allows(trained, tmp_path, capsys):
    """safetensors writes 0600; the merged model, the adapter and the checkpoints are outputs like
    config.json beside them (0644 under umask 022), for a server or a teammate to read (issue #38)."""
    import os
    import stat

    from .cli_helpers import run_cli

    old = os.umask(0o022)
    try:
        code, out, err = run_cli(["export", str(trained["run"]), "--to", "merged", "--out", str(tmp_path / "m")],
                                 capsys)
    finally:
        os.umask(old)
    assert code == 0, out + err
    for f in [tmp_path / "m" / "model.safetensors", tmp_path / "m" / "config.json",
              *trained["run"].glob("adapter/*.safetensors"), *trained["run"].glob("checkpoints/*/*.safetensors")]:
        assert stat.S_IMODE(f.stat().st_mode) == 0o644, f


def test_gguf_adapter_has_llama_cpp_layout_and_matches_the_merged_model_gguf(trained, tmp_path):
    """llama.cpp applies ``W + alpha / rank * lora_b @ lora_a`` to the GGUF tensor of the same name:
    so base GGUF + adapter GGUF must equal the merged model's GGUF, tensor for tensor."""
    from transformers import AutoModelForCausalLM

    done = export_run(trained["run"], "gguf", out=tmp_path / "g")
    kv, ad = gguf.read(done.out / "t.gguf")
    assert kv["general.architecture"] == "llama" and kv["general.type"] == "adapter"
    assert kv["adapter.type"] == "lora" and kv["adapter.lora.alpha"] == pytest.approx(16.0)
    assert "blk.0.attn_q.weight.lora_a" in ad and "blk.1.ffn_down.weight.lora_b" in ad
    assert ad["blk.0.attn_q.weight.lora_a"].shape == (8, 32)  # r x in
    assert not any(k.startswith(("token_embd", "output.")) for k in ad)

    export_run(trained["run"], "merged", out=tmp_path / "m")
    gguf.write_model(tmp_path / "m", tmp_path / "merged.gguf", "f32")
    base_dir = tmp_path / "base"
    AutoModelForCausalLM.from_pretrained(str(trained["base"])).save_pretrained(str(base_dir))
    shutil.copy(trained["base"] / "tokenizer.json", base_dir)
    shutil.copy(trained["base"] / "tokenizer_config.json", base_dir)
    gguf.write_model(base_dir, tmp_path / "base.gguf", "f32")
    _, merged = gguf.read(tmp_path / "merged.gguf")
    _, base = gguf.read(tmp_path / "base.gguf")
    scale = kv["adapter.lora.alpha"] / 8
    pairs = {k[: -len(".lora_a")] for k in ad if k.endswith(".lora_a")}
    assert len(pairs) == 2 * 7  # q, k, v, o, gate, up, down in two blocks
    for name in pairs:
        rebuilt = base[name] + scale * ad[f"{name}.lora_b"] @ ad[f"{name}.lora_a"]
        assert np.allclose(rebuilt, merged[name], atol=1e-4), name


def test_model_gguf_holds_the_vocabulary_and_llama_permuted_q(trained, tmp_path):
    from safetensors.torch import load_file
    from transformers import AutoTokenizer

    gguf.write_model(trained["base"], tmp_path / "b.gguf", "f32")
    kv, t = gguf.read(tmp_path / "b.gguf")
    tok = AutoTokenizer.from_pretrained(str(trained["base"]))
    assert kv["tokenizer.ggml.model"] == "gpt2" and len(kv["tokenizer.ggml.tokens"]) == len(tok)
    assert kv["tokenizer.ggml.eos_token_id"] == tok.eos_token_id
    assert kv["llama.attention.head_count_kv"] == 2 and kv["llama.block_count"] == 2
    hf = load_file(str(trained["base"] / "model.safetensors"))
    q = torch.from_numpy(np.array(t["blk.0.attn_q.weight"]))
    assert torch.equal(gguf.unpermute(q, 4, 4), hf["model.layers.0.self_attn.q_proj.weight"])
    assert not torch.equal(q, hf["model.layers.0.self_attn.q_proj.weight"])


def test_ollama_modelfile_defaults_to_the_merged_gguf(trained, tmp_path):
    done = export_run(trained["run"], "ollama", out=tmp_path / "o")
    assert done.files == ["Modelfile", "README.txt", "model.gguf"]
    text = (done.out / "Modelfile").read_text()
    assert text.startswith("FROM ./model.gguf\n") and "ADAPTER" not in text
    assert 'PARAMETER stop "<|im_end|>"' in text and "<|im_start|>assistant" in text
    assert "ollama create t -f Modelfile" in done.notes
    with_adapter = export_run(trained["run"], "ollama", out=tmp_path / "oa", adapter_mode=True)
    assert "ADAPTER ./adapter.gguf" in (with_adapter.out / "Modelfile").read_text()
    assert any("reported to refuse" in n for n in with_adapter.notes)


def test_gguf_refuses_full_embedding_weights_like_llama_cpp(trained):
    from transformers import AutoConfig

    cfg = AutoConfig.from_pretrained(str(trained["base"]))
    state = {"base_model.model.model.embed_tokens.weight": torch.zeros(10, 32)}
    with pytest.raises(ExportError, match=r"full weight .*embed_tokens"):
        gguf.adapter_tensors(state, cfg)


# ----------------------------------------------------------------------------- bad input


def test_run_without_checkpoints_is_a_clear_error(trained, tmp_path):
    empty = tmp_path / "empty"
    (empty / "checkpoints").mkdir(parents=True)
    shutil.copy(trained["run"] / "spec.yaml", empty / "spec.yaml")
    with pytest.raises(ExportError, match=re.escape(f"{empty} has no checkpoint")):
        export_run(empty, "peft")
    with pytest.raises(ExportError, match="no checkpoint step-99"):
        export_run(trained["run"], "peft", checkpoint=99)


def test_truncated_or_foreign_adapter_names_the_file_and_writes_nothing(trained, tmp_path):
    from safetensors.torch import save_file

    run = tmp_path / "run"
    shutil.copytree(trained["run"], run)
    shutil.rmtree(run / "adapter")
    f = run / "checkpoints" / "step-4" / "adapter.safetensors"
    f.write_bytes(f.read_bytes()[:200])
    with pytest.raises(ExportError, match="incomplete or damaged"):  # the manifest catches it first
        export_run(run, "peft", checkpoint=4)
    single = tmp_path / "x.safetensors"
    single.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{}")
    from lorapod.export.source import read_safetensors

    with pytest.raises(ExportError, match=re.escape(f"{single} is not a readable safetensors file")):
        read_safetensors(single)
    (run / "adapter").mkdir()
    save_file({"model.embed_tokens.weight": torch.zeros(2, 2)}, str(run / "adapter" / "adapter_model.safetensors"))
    with pytest.raises(ExportError, match=r"adapter_model\.safetensors is not a LoRA adapter"):
        export_run(run, "peft", out=tmp_path / "never")
    assert not (tmp_path / "never").exists()


def test_mismatched_base_is_refused_and_existing_output_is_kept(trained, tmp_path):
    other = make_model_dir(tmp_path / "other", hidden=48, layers=2)
    with pytest.raises(ExportError, match="does not fit the base model"):
        export_run(trained["run"], "merged", out=tmp_path / "m", base=str(other))
    assert not (tmp_path / "m").exists()
    keep = tmp_path / "keep"
    keep.mkdir()
    (keep / "mine.txt").write_text("x")
    with pytest.raises(ExportError, match="never overwrites"):
        export_run(trained["run"], "peft", out=keep)
    assert (keep / "mine.txt").read_text() == "x" and len(list(keep.iterdir())) == 1


def test_eval_compares_base_and_every_checkpoint_and_recommends_one(trained, tmp_path):
    from typer.testing import CliRunner

    from lorapod.cli.main import build_app
    from lorapod.evaluate.llm import Row, evaluate_llm, recommend

    run = tmp_path / "run"
    shutil.copytree(trained["run"], run)
    res = evaluate_llm(run, n_prompts=2, device="cpu", max_new_tokens=8, log=lambda m: None)
    assert [r.label for r in res.rows] == ["base", "step-2", "step-4"]
    assert res.rows[2].val_loss < res.rows[0].val_loss  # training helped
    assert res.best == min(res.rows[1:], key=lambda r: r.val_loss).label
    assert len(res.answers) == 2 and any(a["base"] != a["tuned"] for a in res.answers)
    assert (run / "eval" / "val_loss.png").read_bytes()[:4] == b"\x89PNG"
    assert "| base |" in (run / "eval" / "eval.md").read_text()
    # the rule itself: lowest loss wins, and a later rise is called out
    rows = [Row("base", None, 3.0, 20.0), Row("step-2", 2, 2.0, 7.4), Row("step-4", 4, 2.5, 12.2)]
    best, why = recommend(rows)
    assert best == "step-2" and "turned up" in why and "over-fit" in why
    res2 = CliRunner().invoke(build_app(), ["eval", str(run), "--n-prompts", "1", "--device", "cpu"])
    assert res2.exit_code == 0, res2.output
    assert "Recommended:" in res2.output


# ----------------------------------------------------------------------------- llama.cpp's own converters

LLAMA_CPP_SDIST = "llama-cpp-python==0.3.36"  # ships vendor/llama.cpp/ (converters, conversion/, gguf-py/)


@pytest.fixture(scope="module")
def llama_cpp(tmp_path_factory):
    """llama.cpp's converters from llama-cpp-python's source distribution (downloaded once per
    machine into LORAPOD_TEST_CACHE or ~/.cache/lorapod-tests; skipped when the registry is
    unreachable). Used as the reference only; none of their code is in lorapod."""
    import os
    import subprocess
    import sys
    import tarfile
    from pathlib import Path

    cache = Path(os.environ.get("LORAPOD_TEST_CACHE", Path.home() / ".cache" / "lorapod-tests"))
    cache.mkdir(parents=True, exist_ok=True)
    found = sorted(cache.glob("llama_cpp_python-*.tar.gz"))
    if not found:
        cmd = [sys.executable, "-m", "pip", "download", LLAMA_CPP_SDIST, "--no-deps", "--no-binary", ":all:",
               "-d", str(cache)]
        try:
            subprocess.run(cmd, check=True, capture_output=True, timeout=900)
        except (subprocess.SubprocessError, OSError) as exc:
            pytest.skip(f"llama-cpp-python's sdist could not be downloaded: {exc}")
        found = sorted(cache.glob("llama_cpp_python-*.tar.gz"))
    root = tmp_path_factory.mktemp("llamacpp")
    with tarfile.open(found[-1]) as tar:
        wanted = [m for m in tar.getmembers()
                  if re.search(r"/vendor/llama\.cpp/(convert_[a-z_]+\.py|conversion/|gguf-py/)", m.name)]
        tar.extractall(root, members=wanted, filter="data")
    return next(root.glob("*/vendor/llama.cpp"))


@pytest.mark.slow
def test_adapter_and_model_gguf_equal_llama_cpp_converters_output(trained, llama_cpp, tmp_path):
    """Tensor for tensor: our adapter GGUF vs convert_lora_to_gguf.py on our PEFT export, and our
    model GGUF vs convert_hf_to_gguf.py on the base (its vocabulary step is skipped: the test's
    tokenizer is not one llama.cpp recognises, and its Llama path wants sentencepiece)."""
    import subprocess
    import sys

    peft_dir = export_run(trained["run"], "peft", out=tmp_path / "p").out
    ours = export_run(trained["run"], "gguf", out=tmp_path / "g").out / "t.gguf"
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    subprocess.run([sys.executable, str(llama_cpp / "convert_lora_to_gguf.py"), "--base", str(trained["base"]),
                    "--outtype", "f32", "--outfile", str(tmp_path / "ref.gguf"), str(peft_dir)],
                   check=True, capture_output=True, env=env, timeout=300)
    kv_ours, t_ours = gguf.read(ours)
    kv_ref, t_ref = gguf.read(tmp_path / "ref.gguf")
    assert set(t_ours) == set(t_ref)
    for k in t_ref:
        assert np.allclose(t_ours[k], t_ref[k], atol=1e-6), k
    for k in ("general.architecture", "general.type", "adapter.type", "adapter.lora.alpha"):
        assert kv_ours[k] == kv_ref[k], k

    wrapper = tmp_path / "convert_model.py"
    wrapper.write_text(
        "import runpy, sys\n"
        f"sys.path[:0] = [{str(llama_cpp)!r}, {str(llama_cpp / 'gguf-py')!r}]\n"
        "import conversion.llama as L\n"
        "L.LlamaModel.set_vocab = lambda self: None\n"
        "sys.argv = ['convert_hf_to_gguf.py', *sys.argv[1:]]\n"
        f"runpy.run_path({str(llama_cpp / 'convert_hf_to_gguf.py')!r}, run_name='__main__')\n")
    subprocess.run([sys.executable, str(wrapper), "--outtype", "f32", "--outfile", str(tmp_path / "ref_model.gguf"),
                    str(trained["base"])], check=True, capture_output=True, env=env, timeout=300)
    gguf.write_model(trained["base"], tmp_path / "model.gguf", "f32")
    kv_m, t_m = gguf.read(tmp_path / "model.gguf")
    kv_r, t_r = gguf.read(tmp_path / "ref_model.gguf")
    assert set(t_m) == set(t_r)
    for k in t_r:
        assert np.array_equal(t_m[k], t_r[k]), k
    for k, v in kv_r.items():
        if k.startswith("llama."):
            assert kv_m.get(k) == pytest.approx(v), k
