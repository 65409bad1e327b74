"""`lorapod import`: trainer configs -> specs, settings without an equivalent reported, and the
round trip spec -> trainer config -> import -> the same spec (for what maps both ways)."""

from __future__ import annotations

import shlex
import subprocess
import tomllib
from pathlib import Path

import pytest
import yaml

from lorapod.errors import SpecError
from lorapod.spec import load_spec, validate
from lorapod.trainers import prepare
from lorapod.trainers.ai_toolkit import from_ai_toolkit
from lorapod.trainers.axolotl import from_axolotl
from lorapod.trainers.base import Layout
from lorapod.trainers.importer import import_file
from lorapod.trainers.sd_scripts import from_sd_scripts

from .remote_helpers import cli_argv, cli_env
from .test_trainers_golden import DERIVED, example

# What survives the trip, per trainer. Not compared: what a trainer counts differently
# (ai-toolkit: epochs become steps), settings the examples leave at lorapod's defaults that the
# trainer has no word for, and the data path (absolute in the config).
SHARED = ["method.type", "method.r", "method.alpha", "method.dropout", "train.micro_batch_size", "train.optimizer",
          "train.learning_rate", "train.gradient_checkpointing", "train.precision", "train.max_grad_norm"]
ROUND_TRIP = {
    ("sdxl-object-lora", "sd-scripts"): [*SHARED, "model.id", "model.family", "method.train_text_encoder", "data.repeats", "data.resolution", "data.buckets", "data.caption_extension", "data.cache_latents", "data.cache_text_encoder_outputs", "train.epochs", "train.scheduler", "train.warmup_steps", "train.seed", "save.every_epochs", "save.keep_last", "samples.every_epochs", "output.name"],
    ("flux2-klein-lora", "ai-toolkit"): [*SHARED, "model.id", "model.family", "model.variant", "data.trigger", "data.repeats", "data.resolution", "data.buckets", "data.cache_latents", "data.cache_text_encoder_outputs", "train.timestep_sampling", "train.scheduler",
        "train.warmup_steps", "save.every_steps", "save.keep_last", "samples.prompts", "samples.every_steps", "output.name"],
    ("llm-chat-lora", "axolotl"): [*SHARED, "model.id", "model.family", "method.target_modules", "data.val_split", "data.sequence_len", "data.packing", "data.train_on_assistant_only", "train.epochs", "train.grad_accum", "train.scheduler", "train.warmup_ratio", "train.weight_decay", "train.seed", "save.every_steps", "save.keep_last", "eval.every_steps"],
}


def pick(spec, dotted: str):
    node = spec
    for part in dotted.split("."):
        node = getattr(node, part)
    return node


def reimport(job, trainer: str):
    if trainer == "axolotl":
        return from_axolotl(job.config)
    if trainer == "ai-toolkit":
        return from_ai_toolkit(job.config)
    toml = tomllib.loads(next(t for p, t in job.files.items() if p.endswith(".toml")))
    return from_sd_scripts(toml, shlex.join(job.commands[-1].argv))


@pytest.mark.parametrize(("ex", "trainer"), list(ROUND_TRIP))
def test_round_trip_gives_the_same_spec(ex, trainer, tmp_path):
    spec = example(ex, tmp_path)
    _, job = prepare(spec, trainer, Layout("/w"))
    result = reimport(job, trainer)
    back = validate(result.spec)
    diffs = {k: (pick(spec, k), pick(back, k)) for k in ROUND_TRIP[(ex, trainer)] if pick(spec, k) != pick(back, k)}
    if trainer == "ai-toolkit":
        # precision 'auto' is written as bf16 for the GPU; the 24 GB profile is lorapod's own choice
        diffs.pop("train.precision", None) if pick(back, "train.precision") == "bf16" else None
    assert diffs == {}
    assert [Path(p).name for p in back.data_paths()] == [p.name for p in spec.data_paths()]
    assert result.unmapped == []  # everything lorapod writes, it reads back


def test_axolotl_settings_without_an_equivalent_are_reported():
    cfg = yaml.safe_load((DERIVED / "axolotl.example.qlora_chat.derived.yaml").read_text())
    cfg.update({"optimizer": "lion_8bit", "neftune_noise_alpha": 5, "num_epochs": 1.5})
    result = from_axolotl(cfg)
    assert result.unmapped == [("chat_template", "no lorapod equivalent"),  # lorapod uses the tokenizer's own
                               ("num_epochs", "1.5 epochs: lorapod counts whole epochs (2)"),
                               ("optimizer", "optimizer 'lion_8bit': lorapod has adamw (adamw_torch, adamw_torch_fused) "
                                             "and adamw_8bit (adamw_bnb_8bit, adamw_8bit, paged_adamw_8bit)"),
                               ("flash_attention", "no lorapod equivalent"),
                               ("neftune_noise_alpha", "no lorapod equivalent")]
    spec = validate(result.spec)
    assert (spec.model.id, spec.method.type, spec.data.format, spec.data.val_split) == (
        "NousResearch/Meta-Llama-3-8B-Instruct", "qlora", "messages", 0.05)


def test_ai_toolkit_derived_example_imports():
    cfg = yaml.safe_load((DERIVED / "ai_toolkit.example.flux2_klein_4b_lora.derived.yaml").read_text())
    result = from_ai_toolkit(cfg)
    spec = validate(result.spec)
    assert (spec.model.family, spec.model.variant, spec.model.dtype, spec.method.r, spec.train.max_steps) == (
        "flux2", "4b", "fp8", 32, 2000)
    assert ("datasets[].resolution", "[512, 768, 1024]: lorapod trains at one resolution (1024) with buckets") \
        in result.unmapped
    # guidance 4 is what lorapod writes for klein (ai-toolkit's UI); another step count is not
    assert ("sample.sample_steps", "no lorapod equivalent") in result.unmapped
    assert not any(key == "sample.guidance_scale" for key, _ in result.unmapped)


def test_sd_scripts_import_reports_the_docs_trap(tmp_path):
    toml = tmp_path / "dataset.toml"
    toml.write_text('[general]\nenable_bucket = true\n\n[[datasets]]\nresolution = [1024, 1024]\nbatch_size = 2\n\n'
                    '  [[datasets.subsets]]\n  image_dir = "/data/mug"\n  num_repeats = 10\n  color_aug = true\n')
    flags = ("accelerate launch sdxl_train_network.py --pretrained_model_name_or_path sdxl.safetensors --network_dim 32 "
             "--network_alpha 16 --optimizer_type Prodigy --text_encoder_lr1 1e-5 --text_encoder_lr2 1e-5 "
             "--network_train_unet_only --max_train_epochs 10 --mixed_precision bf16")
    proc = subprocess.run([*cli_argv(), "import", str(toml), "--flags", flags], capture_output=True, text=True,
                          env=cli_env(), timeout=60)
    assert proc.returncode == 0, proc.stderr
    spec = validate(yaml.safe_load(proc.stdout))
    assert (spec.model.family, spec.method.r, spec.method.alpha, spec.train.micro_batch_size, spec.data.repeats) == (
        "sdxl", 32, 16.0, 2, 10)
    err = " ".join(proc.stderr.split())
    assert "4 setting(s) without a lorapod equivalent" in err
    assert "--text_encoder_lr1: not an option of the pinned sd-scripts (the SDXL docs' --text_encoder_lr1/2" in err
    assert "--optimizer_type: optimizer 'Prodigy'" in err and "dataset.color_aug" in err


def test_import_refuses_what_it_cannot_read(tmp_path):
    bad = tmp_path / "x.yaml"
    bad.write_text("foo: 1\n")
    with pytest.raises(SpecError, match="neither an sd-scripts dataset TOML") as err:
        import_file(bad)
    # every trainer that reads its configs back is named, from the registry
    assert "an ai-toolkit job (job:, config:)" in str(err.value) and "an axolotl config (base_model:)" in str(err.value)
    assert load_spec  # the spec loader is what validates an imported file later


# The LLM guide's axolotl config (../shared/seeds/002_*.txt, "Paso 5"), key for key; its JSON
# comments dropped. Issue 48 F6: the import dropped `optimizer: adamw_8bit` ("lorapod has adamw and
# adamw_8bit") and flagged `load_in_8bit: false`.
GUIDE_AXOLOTL = {
    "base_model": "NousResearch/Llama-3.2-1B", "load_in_4bit": False, "load_in_8bit": False, "adapter": "lora",
    "lora_r": 16, "lora_alpha": 32, "lora_dropout": 0.05,
    "lora_target_modules": ["q_proj", "v_proj", "k_proj", "o_proj", "gate_proj", "down_proj", "up_proj"],
    "datasets": [{"path": "teknium/GPT4-LLM-Cleaned", "type": "alpaca"}], "val_set_size": 0.1, "sequence_len": 2048,
    "output_dir": "./outputs/lora-out", "num_epochs": 3, "micro_batch_size": 2, "gradient_accumulation_steps": 4,
    "optimizer": "adamw_8bit", "lr_scheduler": "cosine", "learning_rate": 0.0002, "bf16": "auto",
    "gradient_checkpointing": True, "logging_steps": 10,
}


def test_the_llm_guides_axolotl_config_imports_whole(tmp_path):
    path = tmp_path / "guide.yaml"
    path.write_text(yaml.safe_dump(GUIDE_AXOLOTL))
    result = import_file(path)
    spec = validate(result.spec)
    assert spec.train.optimizer == "adamw_8bit" and spec.method.type == "lora" and spec.train.epochs == 3
    assert result.unmapped == []  # nothing of it is lost: load_in_8bit false is what lorapod does anyway


def test_an_8bit_base_is_reported_not_dropped():
    result = from_axolotl({**GUIDE_AXOLOTL, "load_in_8bit": True})
    assert [k for k, _ in result.unmapped] == ["load_in_8bit"]
    assert "8-bit" in dict(result.unmapped)["load_in_8bit"]


def test_every_adamw_transformers_runs_for_axolotl_imports_as_one_of_lorapods():
    """axolotl hands ``optimizer`` to transformers' TrainingArguments (its recorded contract: "accepts
    any string"), whose dispatch (transformers trainer_optimizer.py, the same at axolotl's pinned 5.16.1
    and the 5.x here) gives torch's AdamW to ``_get_adamw_torch``'s names and bitsandbytes' 8-bit AdamW
    to the 8-bit adam names of ``_BITSANDBYTES_OPTIMIZERS``. Each of those imports as lorapod's adamw /
    adamw_8bit; every other name the importer maps is either one of them or a name transformers 4.x had."""
    tro = pytest.importorskip("transformers.trainer_optimizer")
    from lorapod.trainers.axolotl import IMPORTED_OPTIMIZERS, LEGACY_OPTIMIZERS

    torch_adamw = {str(n.value) for n, h in tro._OPTIMIZER_HANDLERS.items() if h is tro._get_adamw_torch}
    bnb_adamw8 = {str(n.value) for n in tro._BITSANDBYTES_OPTIMIZERS
                  if "adam" in n.value and "ademamix" not in n.value and "8bit" in n.value}
    assert {"adamw_torch", "adamw_torch_fused"} <= torch_adamw and {"adamw_8bit", "adamw_bnb_8bit"} <= bnb_adamw8
    assert {n: IMPORTED_OPTIMIZERS.get(n) for n in torch_adamw} == dict.fromkeys(torch_adamw, "adamw")
    assert {n: IMPORTED_OPTIMIZERS.get(n) for n in bnb_adamw8} == dict.fromkeys(bnb_adamw8, "adamw_8bit")
    assert set(IMPORTED_OPTIMIZERS) - torch_adamw - bnb_adamw8 == set(LEGACY_OPTIMIZERS)
