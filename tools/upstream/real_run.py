"""Real training steps of sd-scripts, musubi-tuner and ai-toolkit, on CPU, from lorapod's job.

    python tools/upstream/real_run.py CASE --src CHECKOUT --python TRAINER_PYTHON [--record] [--work DIR]
        [--models DIR] [--summary FILE]

CASE is ``sd15`` (sd-scripts train_network.py: two steps, then ``lorapod train --resume`` of
that run folder for two more), ``sdxl`` (sd-scripts sdxl_train_network.py), ``wan``
(musubi-tuner wan_train_network.py, Wan2.1 T2V 1.3B on clips and stills; resumed for two more too),
``zimage`` (musubi-tuner zimage_train_network.py, then its ComfyUI conversion; resumed too),
``qwenimage`` (musubi-tuner qwen_image_train_network.py), ``aitk-sd15`` (ai-toolkit run.py, arch
sd1) or ``sd15-128`` (sd-scripts at
data.resolution 128 with buckets, below sd-scripts' default min_bucket_reso). CHECKOUT is the
trainer at lorapod's pinned commit (tools/upstream/setup.py unpacks it from ../shared/upstream) and
TRAINER_PYTHON a CPU Python with its requirements (setup.py builds it; docs/trainers.md, "Real runs").

Each run is a user's: ``TRAINER_PYTHON -m lorapod train SPEC --trainer X --trainer-src CHECKOUT``
(lorapod's job wrapper, ``trainers.runner.run_trainer``, what ``trainer-run`` runs on an
instance), under ``/usr/bin/time -v`` for the peak memory, with ``HF_HUB_OFFLINE=1``. The weights
are random in the real shapes, built by tools/upstream/real_models.py under the trainer's Python
(its docstring names each stand-in and why). Afterwards it compares lorapod's metrics.jsonl with
the loss the trainer logged itself (its TensorBoard events, read with tensorboard's
EventAccumulator; ai-toolkit's loss_log.db), step by step, and checks the LoRA file with
``lorapod inspect``'s reader. ``--record`` writes tests/recorded/<case>/: the trainer's output as
printed (``\\r`` kept; the work folder written as /r), the trainer's own logged losses, the files
it wrote and the run folder, the LoRA's key names and shapes (no weights), time and peak memory.
tests/test_trainers_recorded_real.py checks lorapod's bridge and mirror against those records.

What a run must show, or the script exits 1 (the ``upstream`` tests and .ci/run rely on it): every
launch exits 0; lorapod's metrics are steps 1..N, each once and in order (ai-toolkit's from step 2:
it logs nothing for its first update), and equal the trainer's own log at every step; the final LoRA is in the run folder's ``adapter/`` and ``lorapod inspect``
reads it as a kohya file that ComfyUI's key rule loads whole (no module dropped), and ``lorapod export
RUN --to comfyui`` writes that file; a resumed case
continues at the right step (its checkpoints are named by the run's steps: ``step-3``, ``step-4``).
The data folder is made afresh for each run, so sd-scripts' latent cache (``.npz`` beside the
images) never carries over from an earlier one and a rerun gives the same losses. ``--models``
keeps the built models between runs (a folder per model and builder version); ``--summary``
appends the case's wall time and peak memory per launch (and its model's size on disk) to a JSON-lines
file; ``--drop-model`` deletes the model when the case ends (.ci/run's stage does, after each model's
last case: the built models together took 35 GB, more than a CI machine spares).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
RECORDED = REPO / "tests" / "recorded"
MODELS = Path(__file__).with_name("real_models.py")
TRAINER = {"sd15": "sd-scripts", "sd15-128": "sd-scripts", "sdxl": "sd-scripts", "wan": "musubi-tuner",
           "aitk-sd15": "ai-toolkit", "zimage": "musubi-tuner", "qwenimage": "musubi-tuner"}
# the random-weight model each case trains (real_models.py builds it)
MODEL = {"sd15": "sd15", "sd15-128": "sd15", "sdxl": "sdxl", "wan": "wan", "aitk-sd15": "sd15", "zimage": "zimage",
         "qwenimage": "qwenimage"}
# what each trainer's TensorBoard/database calls the loss lorapod's bridge reads
TB_LOSS = {"sd-scripts": "loss/average", "musubi-tuner": "loss/average"}
RESUMED = ("sd15", "wan", "zimage")  # the cases resumed for two more steps (lorapod train --resume)
# the start-up stand-ins each trainer needs on a CPU torch (tools/upstream/cpu_shims.py says why)
SHIMS = {"sd-scripts": "torchvision", "musubi-tuner": "torchvision,cuda_device,umt5_random,depth,bf16_cpu",
         "ai-toolkit": "torchvision,torchaudio"}


def install_shims(python: str) -> None:
    """cpu_shims.py into the trainer's virtualenv, imported at every start (acting only when
    LORAPOD_CPU_SHIMS names a shim)."""
    site = subprocess.run([python, "-c", "import site; print(site.getsitepackages()[0])"], capture_output=True,
                          text=True, check=True).stdout.strip()
    Path(site, "lorapod_cpu_shims.py").write_text(Path(__file__).with_name("cpu_shims.py").read_text())
    Path(site, "zz_lorapod_cpu_shims.pth").write_text("import lorapod_cpu_shims\n")


def make_images(folder: Path, n: int = 2, size: int = 256, caption: str = "zxq_mug, a mug on a table") -> Path:
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    shutil.rmtree(folder, ignore_errors=True)  # sd-scripts caches latents beside the images (.npz)
    folder.mkdir(parents=True)
    for i in range(n):
        Image.fromarray(rng.integers(0, 255, (size, size, 3), dtype=np.uint8)).save(folder / f"img{i}.png")
        (folder / f"img{i}.txt").write_text(caption)
    return folder


def make_clips(folder: Path, size: int = 128) -> Path:
    """Two 2-second 30 fps clips and two stills, with captions (what examples/wan21-video-clips.yaml trains on)."""
    import numpy as np
    from PIL import Image

    sys.path.insert(0, str(REPO / "src"))
    from lorapod.data.clips import write_clip

    rng = np.random.default_rng(0)
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    for i in range(2):
        Image.fromarray(rng.integers(0, 255, (size, size, 3), dtype=np.uint8)).save(folder / f"still{i}.png")
        (folder / f"still{i}.txt").write_text("zxq standing")
        write_clip(folder / f"clip{i}.mp4", [rng.integers(0, 255, (size, size, 3), dtype=np.uint8) for _ in range(60)],
                   fps=30.0)
        (folder / f"clip{i}.txt").write_text("zxq walking")
    return folder


def spec_for(case: str, root: Path, steps: int, model: Path) -> dict:
    """The job: a user's spec, small (2 images, 2 steps, rank 4), saving every step."""
    common = {"method": {"type": "lora", "r": 4, "alpha": 4, "dropout": 0.0, "target_modules": "all-linear"},
              "save": {"every_steps": 1, "every_epochs": None, "keep_last": 2},
              "output": {"dir": str(root / "runs"), "name": "real"}}
    train = {"max_steps": steps, "micro_batch_size": 1, "grad_accum": 1, "optimizer": "adamw", "precision": "fp32",
             "learning_rate": 1e-4, "scheduler": "constant", "gradient_checkpointing": True, "seed": 42}
    if case in ("sd15", "sd15-128", "sdxl", "aitk-sd15"):
        fam = "sdxl" if case == "sdxl" else "sd15"
        return {**common, "model": {"id": str(model), "family": fam},
                "data": {"path": str(make_images(root / "mug")), "format": "images",
                         "resolution": 128 if case == "sd15-128" else 256,
                         "repeats": 1, "buckets": True, "trigger": "zxq_mug", "cache_latents": True,
                         "cache_text_encoder_outputs": False},
                "train": train}
    if case == "wan":  # examples/wan21-video-clips.yaml, small
        return {**common, "model": {"id": "Wan-AI/Wan2.1-T2V-1.3B-Diffusers", "family": "wan21"},
                "data": {"path": str(make_clips(root / "clips")), "format": "video", "resolution": 128,
                         "target_frames": [1, 5], "frame_extraction": "head", "fps": 16, "trigger": "zxq",
                         "buckets": True},
                "train": {**train, "timestep_sampling": "shift", "timestep_shift": 3.0}}
    if case in ("zimage", "qwenimage"):  # examples/zimage-musubi-lora.yaml, qwenimage-musubi-lora.yaml, small
        model_id = {"zimage": "Tongyi-MAI/Z-Image", "qwenimage": "Qwen/Qwen-Image"}[case]
        return {**common, "model": {"id": model_id, "family": case, "dtype": "bf16"},
                "data": {"path": str(make_images(root / "mug", size=128)), "format": "images", "resolution": 128,
                         "repeats": 1, "buckets": True, "trigger": "zxq_mug"},
                # Qwen-Image's DiT trains in bf16 only (trainers/musubi.py ARCHS): autocast, as on a GPU
                "train": {**train, "timestep_sampling": "shift", "timestep_shift": 2.0,
                          **({"precision": "bf16"} if case == "qwenimage" else {})}}
    raise SystemExit(f"unknown case {case}")


# Runs ARGV and writes the peak resident size (kB) of the largest process in its tree that ended: the
# lorapod process and everything it waited for (getrusage RUSAGE_CHILDREN, as /usr/bin/time -v's
# "Maximum resident set size", without needing that binary on the machine).
PEAK = ("import resource, subprocess, sys; rc = subprocess.call(sys.argv[2:]); "
        "open(sys.argv[1], 'w').write(str(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)); sys.exit(rc)")


def run_lorapod(python: str, args: list[str], env: dict, cwd: Path) -> tuple[int, bytes, float, int]:
    """``python -m lorapod ARGS``: exit code, output, seconds, peak RSS (kB)."""
    t0 = time.monotonic()
    peak = cwd / "peak_kb.txt"
    proc = subprocess.run([sys.executable, "-c", PEAK, str(peak), python, "-m", "lorapod", *args], env=env,
                          cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, check=False)
    secs = time.monotonic() - t0
    kb = int(peak.read_text() or 0) if peak.is_file() else 0
    return proc.returncode, proc.stdout, secs, kb


def tb_runs(logs: Path, tag: str) -> list[list[tuple[int, float]]]:
    """The trainer's own logged loss per step, one list per launch (each writes its own timestamped
    TensorBoard folder), oldest first."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    runs = []
    for folder in sorted({e.parent for e in logs.rglob("events.out.tfevents.*")}):
        acc = EventAccumulator(str(folder), size_guidance={"scalars": 0})
        acc.Reload()
        if tag in acc.Tags().get("scalars", []):
            runs.append(sorted({e.step: e.value for e in acc.Scalars(tag)}.items()))
    return runs


def aitk_losses(db: Path) -> list[tuple[int, float]]:
    """ai-toolkit's own log (its UILogger's loss_log.db): ``loss/loss`` per step as it numbers them."""
    import sqlite3

    if not db.is_file():
        return []
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return [(int(s), float(v)) for s, v in con.execute(
            "SELECT step, value_real FROM metrics WHERE key = 'loss/loss' ORDER BY step")]
    finally:
        con.close()


def metrics(run: Path) -> list[dict]:
    path = run / "metrics.jsonl"
    if not path.is_file():
        return []
    return [{k: v for k, v in json.loads(x).items() if k != "time"} for x in path.read_text().splitlines() if x]


def same_losses(got: list[dict], logged: list[tuple[int, float]], bar: bool) -> bool:
    """lorapod's loss per step equals the trainer's logged one (the kohya bar shows tqdm's
    ``{:.3g}`` of it: compared at that precision)."""
    mine = [(m["step"], m.get("loss")) for m in got]
    theirs = [(s, float(f"{v:.3g}") if bar else v) for s, v in logged]
    return bool(logged) and mine == theirs


def absolute(runs: list[list[tuple[int, float]]], offsets: list[int]) -> list[tuple[int, float]]:
    """The launches' logged steps as steps of the run: a resumed kohya trainer counts from 0 again
    (docs/trainers.md), so launch i's step n is n + the step it resumed from."""
    return [(s + off, v) for run, off in zip(runs, offsets, strict=False) for s, v in run]


def listing(root: Path) -> list[str]:
    if not root.is_dir():
        return []
    return sorted(str(p.relative_to(root)) + ("/" if p.is_dir() else "") for p in root.rglob("*"))


def lora_keys(path: Path) -> dict[str, list[int]]:
    from safetensors import safe_open

    with safe_open(str(path), "pt") as f:
        return {k: list(f.get_slice(k).get_shape()) for k in sorted(f.keys())}


def lora_check(adapter: Path) -> list[str]:
    """What ``lorapod inspect`` says of the final LoRA: a kohya file ComfyUI's key rule loads whole."""
    sys.path.insert(0, str(REPO / "src"))
    from lorapod.export.inspect import inspect_file

    report = inspect_file(adapter)
    comfy = report["consumers"].get("ComfyUI", {})
    bad = []
    if report["format"] != "kohya":
        bad.append(f"{adapter.name}: inspect reads it as {report['format']}, not kohya")
    if comfy.get("drops") or not comfy.get("loads"):
        bad.append(f"{adapter.name}: ComfyUI loads {comfy.get('loads')} module(s) and drops "
                   f"{len(comfy.get('drops') or [])}: {(comfy.get('drops') or [])[:3]}")
    print(f"  inspect: {report['format']}, family {report['family']}, rank {report['rank']}, "
          f"ComfyUI loads {comfy.get('loads')} of {report['modules']} module(s)")
    return bad


def disk_bytes(folder: Path) -> int:
    """The bytes the files under ``folder`` take on disk (hard links and symlinks counted once / not at all)."""
    seen, total = set(), 0
    for p in folder.rglob("*"):
        st = p.lstat()
        if p.is_file() and not p.is_symlink() and (st.st_dev, st.st_ino) not in seen:
            seen.add((st.st_dev, st.st_ino))
            total += st.st_blocks * 512
    return total


def build_model(kind: str, python: str, models: Path, env: dict) -> tuple[Path, dict | None]:
    """The random-weight model ``kind``, built once per builder version into ``models`` (kept between
    runs), and the build's seconds and peak memory (None when it was built already)."""
    import hashlib

    version = hashlib.sha256(MODELS.read_bytes()).hexdigest()[:10]
    model = models / f"{kind}-{version}"
    if not (model / ".built").is_file():
        shutil.rmtree(model, ignore_errors=True)
        for old in models.glob(f"{kind}-*"):  # an older builder's: not read again
            shutil.rmtree(old, ignore_errors=True)
        t0 = time.monotonic()
        peak = models / f".{kind}-peak_kb.txt"
        subprocess.run([sys.executable, "-c", PEAK, str(peak), python, str(MODELS), kind, str(model), str(models / "hf")],
                       env=env, check=True)
        secs, kb = time.monotonic() - t0, int(peak.read_text())
        print(f"built {model.name} in {secs:.0f} s, peak {kb / 1024 / 1024:.1f} GB", flush=True)
        return model, {"seconds": round(secs), "peak_rss_mb": round(kb / 1024)}
    return model, None


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("case", choices=sorted(TRAINER))
    ap.add_argument("--src", required=True, help="the trainer's checkout at lorapod's pinned commit")
    ap.add_argument("--python", required=True, help="a Python with the trainer's requirements (and lorapod's)")
    ap.add_argument("--work", default=None, help="a folder for the run (default: /tmp/lorapod-real-run)")
    ap.add_argument("--models", default=None, help="where built models are kept between runs (default: WORK/models)")
    ap.add_argument("--summary", default=None, help="append the case's times and peak memory to this JSON-lines file")
    ap.add_argument("--record", action="store_true", help="write tests/recorded/<case>/")
    ap.add_argument("--drop-model", action="store_true",
                    help="delete the built model when the case ends (building it again costs less than its disk)")
    ns = ap.parse_args()
    trainer = TRAINER[ns.case]
    root = Path(ns.work or "/tmp/lorapod-real-run").resolve()
    root.mkdir(parents=True, exist_ok=True)
    models = Path(ns.models).resolve() if ns.models else root / "models"
    models.mkdir(parents=True, exist_ok=True)
    hf_home = models / "hf"  # the stand-in tokenizers real_models.py puts in a hub cache
    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "HF_HOME": str(hf_home), "HF_HUB_OFFLINE": "1",
           "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
           "PYTHONUNBUFFERED": "1", "COLUMNS": "160", "LORAPOD_CPU_SHIMS": SHIMS[trainer]}
    install_shims(ns.python)
    model, built = build_model(MODEL[ns.case], ns.python, models, env)

    import yaml

    steps = 2
    work = root / ns.case
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    spec = work / "spec.yaml"
    spec.write_text(yaml.safe_dump(spec_for(ns.case, root, steps, model)))
    run = work / "run"
    if trainer == "musubi-tuner":  # the files lorapod's job downloads, already where it puts them (offline: kept)
        linked = work / f".{run.name}-trainer" / "trainer" / "models"
        linked.parent.mkdir(parents=True, exist_ok=True)
        linked.symlink_to(model)
    phases = [("two-steps", ["train", str(spec), "--trainer", trainer, "--trainer-src", ns.src, "--run-dir", str(run)])]
    if ns.case in RESUMED:
        phases.append(("resume", ["train", "--resume", str(run), "--trainer-src", ns.src,
                                  "--set", f"train.max_steps={2 * steps}"]))
    results = {}
    trainer_out = work / f".{run.name}-trainer" / "trainer"
    problems: list[str] = []
    for name, args in phases:
        rc, out, secs, peak = run_lorapod(ns.python, args, env, work)
        (work / f"{name}.log").write_bytes(out)  # the whole output, for a failure's reason
        got = metrics(run)
        runs = tb_runs(trainer_out / "logs", TB_LOSS[trainer]) if trainer in TB_LOSS else \
            [aitk_losses(trainer_out / "out" / "real" / "loss_log.db")]
        # ai-toolkit's step k is its (k+1)-th update (BaseSDTrainProcess.run loops from 0)
        first = 1 if trainer == "ai-toolkit" else 0
        logged = absolute(runs, [first] + [int(m.group(1)) for m in re.finditer(
            rb"resuming .* \(step (\d+):", b"".join(r["log"] for r in results.values()) + out)])
        results[name] = {"rc": rc, "seconds": round(secs), "peak_rss_mb": round(peak / 1024),
                         "trainer_out": listing(trainer_out / "out"), "run": listing(run), "metrics": got,
                         "cache": listing(trainer_out / "cache"),  # musubi's latent / text-encoder cache files
                         "trainer_logged": runs, "log": out.replace(str(root).encode(), b"/r")}
        tail = out.decode(errors="replace").strip().splitlines()[-3:]
        print(f"{ns.case} {name}: exit {rc} in {secs:.0f} s, peak {peak / 1024 / 1024:.1f} GB; " + " | ".join(tail))
        print("  lorapod metrics:", [(m["step"], m.get("loss")) for m in got])
        print("  trainer logged: ", logged)
        want = list(range(1, steps * len(results) + 1))
        if trainer == "ai-toolkit":  # it logs nothing for a launch's first update (BaseSDTrainProcess.run:
            want = want[1:]          # "don't do on first step", step_num != start_step): no metrics there
        if rc != 0:
            problems.append(f"{name}: lorapod train exited {rc} (its output: {work / f'{name}.log'})")
            print(out.decode(errors="replace")[-6000:])
            break
        if [m["step"] for m in got] != want:
            problems.append(f"{name}: metrics hold steps {[m['step'] for m in got]}, not {want} each once")
        if not same_losses(got, logged, bar=trainer in TB_LOSS):
            problems.append(f"{name}: lorapod's losses differ from the trainer's own log")
        if name == "resume" and not {"step-3", "step-4"} <= {p.name for p in (run / "checkpoints").iterdir()}:
            problems.append(f"resume: checkpoints {sorted(p.name for p in (run / 'checkpoints').iterdir())}, "
                            "not step-3 and step-4: the resumed trainer's steps were not counted on")
    adapter = sorted((run / "adapter").glob("*.safetensors"))
    keys = lora_keys(adapter[0]) if adapter else {}
    print(f"LoRA: {adapter[0].name if adapter else 'none'}, {len(keys)} tensors")
    if not adapter:
        problems.append("no LoRA in the run folder's adapter/")
    # the file meant for ComfyUI: a converting family's NAME-comfyui.safetensors (musubi's own layout
    # beside it is for musubi's tools), else the one LoRA
    comfy = [a for a in adapter if a.name.endswith("-comfyui.safetensors")] or adapter
    for a in comfy:
        problems += lora_check(a)
    if adapter and not problems:  # what a user does next: lorapod export RUN --to comfyui
        rc, out, _secs, _peak = run_lorapod(sys.executable, ["export", str(run), "--to", "comfyui"], env, work)
        exported = sorted((run / "exports" / "comfyui-final").glob("*.safetensors"))
        print(f"  export --to comfyui: exit {rc}, {[e.name for e in exported]}")
        if rc != 0 or [e.name for e in exported] != [a.name for a in comfy]:
            problems.append(f"lorapod export --to comfyui: exit {rc}, wrote {[e.name for e in exported]}, "
                            f"not {[a.name for a in comfy]}: {out.decode(errors='replace')[-800:]}")
        elif any(lora_keys(e) != lora_keys(a) for e, a in zip(exported, comfy, strict=True)):
            problems.append("lorapod export --to comfyui: the exported file is not the trainer's")
    print("\n".join(f"FAIL: {p}" for p in problems) if problems else
          "ok: every launch exited 0, lorapod's metrics equal the trainer's own log at every step, the LoRA loads whole")
    if ns.summary:
        with open(ns.summary, "a", encoding="utf-8") as fh:
            fh.write(json.dumps({"case": ns.case, "trainer": trainer, "ok": not problems, "problems": problems,
                                 "model": model.name, "model_gb": round(disk_bytes(model) / 1e9, 2),
                                 "phases": {**({f"build {MODEL[ns.case]}": built} if built else {}),
                                            **{n: {"seconds": r["seconds"], "peak_rss_mb": r["peak_rss_mb"]}
                                               for n, r in results.items()}}}) + "\n")
    if ns.record:
        dest = RECORDED / ns.case
        dest.mkdir(parents=True, exist_ok=True)
        for name, r in results.items():
            (dest / f"{name}.log").write_bytes(r.pop("log"))
        (dest / "files.json").write_text(json.dumps({
            "trainer_logged_tag": TB_LOSS.get(trainer), "lora": {"file": adapter[0].name if adapter else None,
                                                                 "keys": keys}, "runs": results}, indent=1) + "\n")
        print(f"recorded in {dest.relative_to(REPO)}")
    if ns.drop_model:
        shutil.rmtree(model, ignore_errors=True)
        print(f"deleted {model} (--drop-model)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
