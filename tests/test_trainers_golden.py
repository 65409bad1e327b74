"""Golden files and contract checks: each example spec x each trainer that can run it.

The golden files (tests/golden/trainers/) are what ``lorapod train SPEC --trainer X --print``
shows; regenerate them with LORAPOD_UPDATE_GOLDEN=1 after a deliberate change and review the
diff. Independently of lorapod's own checks, every command line is parsed against the recorded
argparse interface, every dataset TOML against the recorded schema, the ai-toolkit YAML against
the recorded config classes and the axolotl YAML against axolotl's recorded JSON schema with
``jsonschema`` (and axolotl's own validator when it is installed).
"""

from __future__ import annotations

import os
import shlex
import tomllib
from pathlib import Path

import pytest
import yaml

from lorapod.spec import load_spec
from lorapod.trainers import prepare
from lorapod.trainers.base import Layout
from lorapod.trainers.contracts import check_ai_toolkit, check_argv, check_axolotl, check_dataset_toml, load
from lorapod.trainers.on_instance import print_trainer_job

REPO = Path(__file__).resolve().parents[1]
GOLDEN = REPO / "tests" / "golden" / "trainers"
DERIVED = REPO / "tests" / "contracts" / "trainers"
# example -> (images its comments assume, trainers that take it)
CASES = {
    "sdxl-object-lora": (25, ["sd-scripts", "ai-toolkit"]),
    "flux2-klein-lora": (20, ["ai-toolkit"]),
    "wan21-video-lora": (18, ["musubi-tuner"]),
    "zimage-musubi-lora": (20, ["musubi-tuner"]),
    "qwenimage-musubi-lora": (20, ["musubi-tuner"]),
    "llm-chat-lora": (None, ["axolotl"]),
}
PAIRS = [(ex, tr) for ex, (_, trs) in CASES.items() for tr in trs]


def example(name: str, tmp: Path):
    """The example spec, its image folder stood in by empty files (counted, never opened)."""
    spec = load_spec(REPO / "examples" / f"{name}.yaml")
    n = CASES[name][0]
    if n:
        folder = tmp / Path(str(spec.data.path)).name
        folder.mkdir()
        for i in range(n):
            (folder / f"img{i:02d}.jpg").write_bytes(b"")
        spec.data.path = str(folder)
    return spec


@pytest.mark.parametrize(("ex", "trainer"), PAIRS)
def test_print_matches_golden(ex, trainer, tmp_path):
    text = print_trainer_job(example(ex, tmp_path), trainer)
    golden = GOLDEN / f"{ex}.{trainer}.txt"
    if os.environ.get("LORAPOD_UPDATE_GOLDEN"):
        golden.parent.mkdir(parents=True, exist_ok=True)
        golden.write_text(text)
    assert text == golden.read_text()


@pytest.mark.parametrize(("ex", "trainer"), PAIRS)
def test_every_emitted_option_is_in_the_contract(ex, trainer, tmp_path):
    t, job = prepare(example(ex, tmp_path), trainer, Layout("/w"))
    scripts = [c for c in job.commands if c.script]
    for cmd in scripts:
        at = next(i for i, a in enumerate(cmd.argv) if a.endswith(cmd.script))
        assert check_argv(t.contract, cmd.script, cmd.argv[at + 1:]) == []
    for path, text in job.files.items():
        if path.endswith(".toml"):
            tomllib.loads(text)  # valid TOML, read back by the reader the trainers use
            assert check_dataset_toml(t.contract, text) == []
    if trainer in ("sd-scripts", "musubi-tuner"):
        assert any(c.phase == "train" and c.script for c in job.commands)
    if trainer == "ai-toolkit":
        assert check_ai_toolkit(job.config) == []
    if trainer == "axolotl":
        jsonschema = pytest.importorskip("jsonschema")
        schema = load("axolotl.json")["json_schema_AxolotlInputConfig"]
        jsonschema.validate(yaml.safe_load(next(iter(job.files.values()))), schema)


@pytest.mark.slow
def test_axolotl_config_passes_axolotls_own_validator(tmp_path, monkeypatch):
    """Optional: axolotl 0.19.0's validate_config, when it is installed (pip install --no-deps
    axolotl==0.19.0 addict; see the contract's install_report.minimal_validator_install)."""
    monkeypatch.setenv("AXOLOTL_DO_NOT_TRACK", "1")
    cfgmod = pytest.importorskip("axolotl.utils.config", reason="axolotl is not installed")
    from axolotl.utils.dict import DictDefault

    _, job = prepare(example("llm-chat-lora", tmp_path), "axolotl", Layout("/w"))
    cfgmod.validate_config(DictDefault(job.config))
    broken = {k: v for k, v in job.config.items() if k != "load_in_4bit"}  # qlora needs 4-bit loading
    with pytest.raises(ValueError):
        cfgmod.validate_config(DictDefault(broken))


def test_the_checks_catch_what_upstream_would_reject():
    # the recorded trap: sd-scripts' SDXL docs show --text_encoder_lr1/2, which its parser rejects
    assert check_argv("kohya_sd_scripts.json", "sdxl_train_network.py",
                      ["--text_encoder_lr1", "1e-5"]) == ["sdxl_train_network.py has no option --text_encoder_lr1"]
    assert check_argv("kohya_sd_scripts.json", "sdxl_train_network.py", ["--text_encoder_lr", "1e-5", "2e-5"]) == []
    assert check_argv("kohya_sd_scripts.json", "sdxl_train_network.py", ["--mixed_precision", "fp8"]) == [
        "sdxl_train_network.py --mixed_precision 'fp8': allowed no, fp16, bf16"]
    assert check_argv("kohya_sd_scripts.json", "sdxl_train_network.py", ["--network_dim", "x"]) == [
        "sdxl_train_network.py --network_dim 'x' is not of type int"]
    # voluptuous: a float key rejects a TOML integer, an unknown key is rejected
    bad = '[general]\ncaption_dropout_rate = 0.1\n\n[[datasets]]\nvalidation_split = 1\n\n  [[datasets.subsets]]\n' \
          '  image_dir = "x"\n  num_repeat = 3\n'
    assert check_dataset_toml("kohya_sd_scripts.json", bad) == [
        "datasets[0].validation_split = 1 is not float",
        "datasets[0].subsets[0].num_repeat is not a key the dataset schema accepts"]
    assert check_dataset_toml("kohya_musubi_tuner.json", '[[datasets]]\nvideo_directory = "v"\ntarget_frames = [1, 25]\n'
                              'source_fps = 16\n') == ["datasets[0](video_dataset).source_fps = 16 is not float"]
    # ai-toolkit ignores unknown keys itself; the recorded classes do not
    cfg = yaml.safe_load((DERIVED / "ai_toolkit.example.flux2_klein_4b_lora.derived.yaml").read_text())
    assert check_ai_toolkit(cfg) == []
    cfg["config"]["process"][0]["train"]["learning_rate"] = 1e-4
    cfg["config"]["process"][0]["model"]["arch"] = "flux2_klein"
    assert check_ai_toolkit(cfg) == ["process[0].train.learning_rate is not read by TrainConfig",
                                     "model.arch 'flux2_klein' is not a registered arch (it would silently fall back to SD)"]
    ax = yaml.safe_load((DERIVED / "axolotl.example.qlora_chat.derived.yaml").read_text())
    assert check_axolotl(ax) == []
    ax["lora_rank"] = 16
    ax["sample_packing"] = "yes"
    del ax["base_model"]
    assert check_axolotl(ax) == ["lora_rank is not an axolotl 0.19.0 config key", "base_model is required",
                                 "sample_packing = 'yes' does not match the schema"]


def test_generated_commands_are_shell_safe(tmp_path):
    """A data folder with a space survives the printed command line."""
    spec = example("sdxl-object-lora", tmp_path)
    _, job = prepare(spec, "sd-scripts", Layout("/w w"))
    train = job.commands[-1].render()
    argv = shlex.split(train[train.index("&&") + 3:-1])
    assert argv[argv.index("--output_dir") + 1] == "/w w/trainer/out"
