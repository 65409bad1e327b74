"""lorapod's bridge, mirror and LoRA checks against real sd-scripts / musubi-tuner / ai-toolkit runs.

The fixtures under tests/recorded/<case>/ come from the trainers' own code at lorapod's pinned
commits, trained for real on CPU from lorapod's job (``lorapod train SPEC --trainer X
--trainer-src CHECKOUT``) by tools/upstream/real_run.py ``--record``: the trainer's output as it
printed it (``\\r`` kept), the loss it logged itself (its TensorBoard events / loss_log.db), the
files it wrote and the run folder lorapod made of them, the LoRA's key names and shapes. The
``upstream``-marked test at the end reruns a case when the checkouts are here.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lorapod.trainers import Layout, get
from lorapod.trainers.bridge import KohyaProgress
from lorapod.trainers.runner import Mirror

REPO = Path(__file__).resolve().parents[1]
RECORDED = REPO / "tests" / "recorded"


def files(case: str) -> dict:
    return json.loads((RECORDED / case / "files.json").read_text())


def log(case: str, name: str = "two-steps") -> str:
    return (RECORDED / case / f"{name}.log").read_bytes().decode("utf-8", errors="replace")


def bridged(bridge, text: str, chunk: int = 4096) -> list[dict]:
    recs = []
    for i in range(0, len(text), chunk):  # the wrapper reads the output in chunks of any size
        recs += bridge.feed(text[i:i + chunk])
    return recs + bridge.flush()


def bar_value(x: float) -> float:
    """What the kohya bar shows of a logged value: tqdm's format_num, ``{:.3g}``."""
    return float(f"{x:.3g}")


@pytest.mark.parametrize("case", ["sd15"])
def test_kohya_bridge_gives_each_step_the_loss_the_trainer_logged(case):
    """The trainer redraws its bar on update(1) with the previous step's avr_loss before it sets the
    new one: lorapod's record for every step, the last included, carries that step's own loss, the
    ``loss/average`` the trainer wrote to TensorBoard (to the bar's 3 significant digits)."""
    logged = files(case)["trainer_logged"]["steps"]
    assert [s for s, _ in logged] == [1, 2]
    for chunk in (4096, 7):
        recs = bridged(KohyaProgress(), log(case), chunk)
        assert [r["step"] for r in recs] == [s for s, _ in logged]
        assert [r.get("loss") for r in recs] == [bar_value(v) for _, v in logged]


def replay_kohya(out: Path, listing: list[str], name: str) -> list[list[str]]:
    """The trainer's files in the order it wrote them: each step's LoRA and state, then the final
    LoRA and state (train_network.py: step saves in the loop, save_state_on_train_end at the end)."""
    def step_of(rel: str) -> int:
        m = re.match(rf"{name}-step(\d+)", rel)
        return int(m.group(1)) if m else 10 ** 9
    groups: dict[int, list[str]] = {}
    for rel in listing:
        groups.setdefault(step_of(rel), []).append(rel)
    return [groups[k] for k in sorted(groups)]


def test_kohya_final_state_does_not_count_against_keep_last(tmp_path):
    """keep_last 2 with saves every step: sd-scripts kept step 1 and step 2 and its final state;
    the run folder keeps both steps too (the final state is not one of keep_last)."""
    rec = files("sd15")
    trainer = get("sd-scripts")
    layout = Layout(str(tmp_path))
    out = Path(layout.out)
    mirror = Mirror(trainer, layout, "real", tmp_path / "run", keep_last=2)
    for group in replay_kohya(out, rec["trainer_out"], "real"):
        for rel in group:
            p = out / rel
            if rel.endswith("/"):
                p.mkdir(parents=True, exist_ok=True)
            else:
                p.parent.mkdir(parents=True, exist_ok=True)
                p.write_bytes(rel.encode())
        final = any(not re.search(r"-step\d+", r) for r in group)
        mirror.sync()
        time.sleep(0.02)
        mirror.sync(final=final)
    kept_by_trainer = sorted(f"step-{int(m.group(1))}" for r in rec["trainer_out"]
                             if (m := re.fullmatch(r"real-step(\d+)\.safetensors", r)))
    assert kept_by_trainer == ["step-1", "step-2"]
    ckpts = sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir())
    assert ckpts == sorted([*kept_by_trainer, "last"])
    assert sorted(p.name for p in (tmp_path / "run" / "adapter").iterdir()) == ["real.safetensors"]
    want = sorted(r for r in rec["run"] if r.startswith(("checkpoints/", "adapter/")))
    got = sorted(str(p.relative_to(tmp_path / "run")) + ("/" if p.is_dir() else "")
                 for p in (tmp_path / "run").rglob("*") if p.relative_to(tmp_path / "run").parts[0]
                 in ("checkpoints", "adapter"))
    assert got == want  # what the real run's folder holds


def write_lora(path: Path, keys: dict[str, list[int]]) -> None:
    import torch
    from safetensors.torch import save_file

    save_file({k: torch.full(shape, 0.01) for k, shape in keys.items()}, str(path))


def sd15_unet_meta():
    import torch
    from diffusers import UNet2DConditionModel

    sys.path.insert(0, str(REPO / "tools" / "upstream"))
    from real_models import SD15_UNET

    with torch.device("meta"):
        return UNet2DConditionModel(**SD15_UNET)


def test_sd_scripts_real_lora_loads_in_comfyui_and_inspect(tmp_path):
    """The LoRA sd-scripts saved (its key names and shapes): ComfyUI's key rule finds every module
    on SD 1.5's U-Net and drops none; ``lorapod inspect`` reads it as a kohya SD 1.5 LoRA."""
    from .comfy_consumer import unet_keys

    from lorapod.export.inspect import inspect_file

    keys = files("sd15")["lora"]["keys"]
    assert keys and all(k.startswith("lora_unet_") for k in keys)  # --network_train_unet_only
    key_map = unet_keys(sd15_unet_meta())
    modules = {k.split(".")[0] for k in keys}
    assert sorted(m for m in modules if m not in key_map) == []
    path = tmp_path / "real.safetensors"
    write_lora(path, keys)
    report = inspect_file(path)
    assert report["format"] == "kohya" and report["rank"] == [4]
    assert report["consumers"]["ComfyUI"]["drops"] == [] and report["consumers"]["ComfyUI"]["loads"] == len(modules)


# ---------------------------------------------------------------- the real runs themselves

UPSTREAM = os.environ.get("LORAPOD_UPSTREAM_DIR")


@pytest.mark.upstream
@pytest.mark.slow
@pytest.mark.parametrize("case,trainer,checkout", [("sd15", "SD_SCRIPTS", "sd-scripts")])
def test_real_run_through_lorapods_job(case, trainer, checkout, tmp_path):
    """Two real steps through ``lorapod train --trainer``: exits 0, lorapod's metrics equal the
    trainer's logged loss at every step (tools/upstream/real_run.py checks it and exits 1 if not)."""
    python = os.environ.get(f"LORAPOD_UPSTREAM_PYTHON_{trainer}")
    src = Path(UPSTREAM or "/nonexistent") / checkout
    if not (src.is_dir() and python):
        pytest.skip(f"set LORAPOD_UPSTREAM_DIR (with {checkout}/ at the pinned commit) and "
                    f"LORAPOD_UPSTREAM_PYTHON_{trainer}; docs/trainers.md 'Real runs' has the recipes")
    r = subprocess.run([sys.executable, str(REPO / "tools" / "upstream" / "real_run.py"), case, "--src", str(src),
                        "--python", python, "--work", str(tmp_path)], capture_output=True, text=True, timeout=1800)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
