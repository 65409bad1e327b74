"""Real training steps of sd-scripts, musubi-tuner and ai-toolkit through ``lorapod train --trainer``.

Each case is tools/upstream/real_run.py: the trainer at lorapod's pinned commit (unpacked from
``../shared/upstream`` by tools/upstream/setup.py), its own scripts on random-weight models of the
real shapes, driven exactly as a user's job is (``lorapod train SPEC --trainer X``). The script exits
1 unless every launch exits 0, lorapod's metrics are steps 1..N each once and equal the trainer's own
log at every step, the LoRA lands in the run folder and ComfyUI's key rule (``lorapod inspect``)
loads it whole, and a resumed case continues at the right step. .ci/run runs these one at a time
after README's test command; without the archives (a user's fresh clone) they skip, saying so.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
UPSTREAM = os.environ.get("LORAPOD_UPSTREAM_DIR")
HOW = ("the trainers are not here: run `python tools/upstream/setup.py --archives ../shared/upstream` (the "
       "trainers' source archives at lorapod's pinned commits) and source the env.sh it writes; "
       "docs/trainers.md, 'Real runs'")

# case -> (the trainer's checkout folder, its LORAPOD_UPSTREAM_PYTHON_* variable), in the order they run:
# the two cases on SD 1.5's model next to each other, so it is built once
CASES = {
    "sd15": ("sd-scripts", "SD_SCRIPTS"),
    "aitk-sd15": ("ai-toolkit", "AI_TOOLKIT"),
    "sdxl": ("sd-scripts", "SD_SCRIPTS"),
    "wan": ("musubi-tuner", "MUSUBI_TUNER"),
    # the families lorapod's own engine also trains, here through musubi-tuner (depth reduced: real_models.py)
    "zimage": ("musubi-tuner", "MUSUBI_TUNER"),
    "qwenimage": ("musubi-tuner", "MUSUBI_TUNER"),
}


def _real_run_models() -> dict[str, str]:
    """real_run.py's MODEL (case -> the random-weight model it trains), read from the script itself."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("lorapod_real_run", REPO / "tools" / "upstream" / "real_run.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return dict(module.MODEL)


def last_use(case: str) -> bool:
    """Whether no later case trains ``case``'s model: the stage deletes a model after its last case
    (the built models together took 35 GB; each is built again in 0.5-3 minutes), unless
    LORAPOD_UPSTREAM_KEEP_MODELS is set (iterating on one case)."""
    model = _real_run_models()
    order = list(CASES)
    return all(model[c] != model[case] for c in order[order.index(case) + 1:])


@pytest.mark.upstream
@pytest.mark.slow
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("case", list(CASES))
def test_real_run_through_lorapods_job(case, tmp_path):
    checkout, var = CASES[case]
    python = os.environ.get(f"LORAPOD_UPSTREAM_PYTHON_{var}")
    src = Path(UPSTREAM or "/nonexistent") / checkout
    if not (src.is_dir() and python):
        pytest.skip(HOW)
    cmd = [sys.executable, str(REPO / "tools" / "upstream" / "real_run.py"), case, "--src", str(src),
           "--python", python, "--work", str(tmp_path)]
    if os.environ.get("LORAPOD_UPSTREAM_MODELS"):
        cmd += ["--models", os.environ["LORAPOD_UPSTREAM_MODELS"]]
    if not os.environ.get("LORAPOD_UPSTREAM_KEEP_MODELS") and last_use(case):
        cmd.append("--drop-model")
    if os.environ.get("LORAPOD_UPSTREAM_SUMMARY"):
        cmd += ["--summary", os.environ["LORAPOD_UPSTREAM_SUMMARY"]]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=1700)
    print(r.stdout[-4000:])
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-3000:]
