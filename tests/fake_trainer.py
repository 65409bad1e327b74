"""A stand-in for `lorapod train` on the instance: same run-folder contract, seconds not minutes.

    python fake_trainer.py SPEC --run-dir DIR [--resume] [--step-s 0.1] [--fail-at N] [--hang-at N]
                           [--device-name "NVIDIA GeForce RTX 4090"]

Reads train.max_steps and save.every_steps from the spec, checks the data file arrived, writes
one metrics.jsonl line per step, checkpoints/step-N/ atomically (tmp folder, then rename), and at
the end adapter/. Honours <run_dir>/STOP: saves a checkpoint and exits 0. With --resume it
continues after the newest checkpoint. With --device-name it says, as the engine does, which GPU
timed its steps (device.json) and logs each step's time and memory.

With --chain the run has a state, as a real one does: each step's state is the sha256 of the last
state and the step, its loss read from the state, each checkpoint holds it (with a manifest.json
written last, in the engine's format) and a resume continues from the newest whole checkpoint's
state. A resume from the wrong step, a cut-off checkpoint or a lost state changes every later
loss and the adapter, so "equal to an uninterrupted run" can fail. --ckpt-mb pads each checkpoint
(an optimizer state's bulk) so a pull takes a while.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import sys
import time
from pathlib import Path

import yaml


def save(dirpath: Path, step: int, chain: str | None = None, pad_mb: float = 0.0, write_s: float = 0.0) -> None:
    """As the engine saves (engine/checkpoint.py): files into a temporary sibling, the manifest last,
    then one rename. ``write_s``: how long the write takes between its files and its manifest."""
    tmp = dirpath.with_name(f".tmp-{dirpath.name}")
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "adapter_model.bin").write_bytes(hashlib.sha256(str(step).encode()).digest() * 512)
    (tmp / "state.json").write_text(json.dumps({"step": step, "chain": chain}))
    if chain is not None:
        if pad_mb:
            (tmp / "optimizer.bin").write_bytes(hashlib.sha256(chain.encode()).digest() * int(pad_mb * 32768))
        time.sleep(write_s)
        files = sorted(p for p in tmp.iterdir() if p.is_file())
        manifest = {p.name: {"bytes": p.stat().st_size, "sha256": hashlib.sha256(p.read_bytes()).hexdigest()}
                    for p in files}
        (tmp / "manifest.json").write_text(json.dumps(manifest))  # last, as the engine writes it
    os.replace(tmp, dirpath)


CHAIN_SEED = hashlib.sha256(b"lorapod fake trainer").hexdigest()


def chain_step(chain: str, step: int) -> tuple[str, float]:
    """The next state and its loss."""
    nxt = hashlib.sha256(f"{chain}:{step}".encode()).hexdigest()
    return nxt, round(int(nxt[:8], 16) / 2**32, 6)


def whole(ckpt: Path) -> bool:
    """The engine's rule (engine/checkpoint.py verify): every file matches manifest.json."""
    try:
        manifest = json.loads((ckpt / "manifest.json").read_text())
        return all((ckpt / n).is_file() and (ckpt / n).stat().st_size == m["bytes"]
                   and hashlib.sha256((ckpt / n).read_bytes()).hexdigest() == m["sha256"] for n, m in manifest.items())
    except (OSError, ValueError, KeyError, TypeError):
        return False


def fake_val_loss(lr: float, step: int) -> float:
    """A made-up validation loss: best near lr 3e-4, falling with steps (for sweep rankings)."""
    return round(abs(math.log10(lr) - math.log10(3e-4)) + 1.0 / step, 6)


def fetch_model(run: Path, repo_id: str, download_s: float) -> None:
    """What the engine's first step does with a hub model: a file already in the Hugging Face cache
    is read, anything else is downloaded into it. The cache folder is huggingface_hub's own
    (``constants.HF_HUB_CACHE`` from HF_HOME) in its layout (models--ORG--NAME/snapshots/REV/);
    ``model-fetch.json`` in the run folder says which happened and where."""
    from huggingface_hub import constants

    snap = Path(constants.HF_HUB_CACHE) / ("models--" + repo_id.replace("/", "--")) / "snapshots" / "main"
    weights = snap / "model.safetensors"
    downloaded = not weights.is_file()
    if downloaded:
        time.sleep(download_s)
        snap.mkdir(parents=True, exist_ok=True)
        tmp = weights.with_name(".tmp-model")
        tmp.write_bytes(hashlib.sha256(repo_id.encode()).digest() * 4096)
        os.replace(tmp, weights)
    (run / "model-fetch.json").write_text(json.dumps({"downloaded": downloaded, "hf_hub_cache": str(constants.HF_HUB_CACHE),
                                                      "lorapod_cache_dir": os.environ.get("LORAPOD_CACHE_DIR")}))


class ScriptedScores:
    """A quality scoring (lorapod/quality/autopilot.py's ``Scoring``) that reads its scores from a
    script: the score of the k-th checkpoint is ``curve[k - 1]`` (the last one repeated). Everything
    after it (the records in run/quality, the pick, train.stop_when, the seconds saved) is lorapod's
    own code, run on the instance as the engine runs it."""

    kind = "image"

    def __init__(self, curve: list[float], every: int) -> None:
        self.curve, self.every = curve, every

    def measure(self, step: int) -> dict:
        score = self.curve[min(max(step // self.every, 1), len(self.curve)) - 1]
        return {"kind": self.kind, "strengths": {"1": {"score": score, "se": 0.002, "fidelity": score}},
                "models": {"scripted": "tests/fake_trainer.py --scores"}}


def autopilot(spec_path: str, run: Path, curve: str, every: int):
    from lorapod.quality.autopilot import Autopilot
    from lorapod.spec import load_spec

    pilot = Autopilot(load_spec(spec_path), run, ScriptedScores([float(x) for x in curve.split(",")], every),
                      log=lambda m: print(m, flush=True))
    pilot.start()
    return pilot


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("spec")
    ap.add_argument("--run-dir", required=True)
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--step-s", type=float, default=0.1)
    ap.add_argument("--fail-at", type=int, default=None)
    ap.add_argument("--hang-at", type=int, default=None)
    ap.add_argument("--eval", action="store_true", help="log a val_loss at every checkpoint (see fake_val_loss)")
    ap.add_argument("--device-name", default=None, help="write device.json naming this GPU; log step_time_s, mem_gb")
    ap.add_argument("--hf-model", default=None, help="fetch this base model into the Hugging Face cache first")
    ap.add_argument("--download-s", type=float, default=1.0, help="how long --hf-model's download takes")
    ap.add_argument("--chain", action="store_true", help="a state carried through the steps and checkpoints")
    ap.add_argument("--ckpt-mb", type=float, default=0.0, help="with --chain: pad each checkpoint to about this")
    ap.add_argument("--ckpt-write-s", type=float, default=0.0, help="with --chain: seconds each checkpoint's write takes")
    ap.add_argument("--scores", default=None, help="a scripted quality score per checkpoint (comma-separated): the "
                    "quality autopilot records them and train.stop_when may end the run early, normally")
    ap.add_argument("--gate", action="append", default=[], metavar="STEP=FILE",
                    help="after step STEP (and its checkpoint), wait until FILE exists: a test holds the job "
                         "at a step until it has done what it does there (a condition, not a clock)")
    a = ap.parse_args()
    gates = {int(g.split("=", 1)[0]): Path(g.split("=", 1)[1]) for g in a.gate}
    spec = yaml.safe_load(Path(a.spec).read_text())
    run = Path(a.run_dir)
    run.mkdir(parents=True, exist_ok=True)
    (run / "checkpoints").mkdir(exist_ok=True)
    data = Path(a.spec).parent / spec["data"]["path"]
    n_examples = len(data.read_text().splitlines()) if data.is_file() else len(list(data.rglob("*")))
    max_steps = int(spec["train"].get("max_steps") or 10)
    every = int((spec.get("save") or {}).get("every_steps") or 5)
    start = 1
    chain = CHAIN_SEED if a.chain else None
    if a.resume and a.chain:
        found = sorted((int(p.name.split("-")[1]), p) for p in (run / "checkpoints").glob("step-*") if whole(p))
        if found:
            start = found[-1][0] + 1
            chain = json.loads((found[-1][1] / "state.json").read_text())["chain"]
            # as the engine does on resume (engine/metrics.py): no line after the checkpoint stays
            mf = run / "metrics.jsonl"
            if mf.is_file():
                keep = [x for x in mf.read_text().splitlines(keepends=True)
                        if x.endswith("\n") and json.loads(x).get("step", 0) <= found[-1][0]]
                mf.write_text("".join(keep))
    elif a.resume:
        done = sorted(int(p.name.split("-")[1]) for p in (run / "checkpoints").glob("step-*"))
        start = (done[-1] + 1) if done else 1
    if a.hf_model:
        fetch_model(run, a.hf_model, a.download_s)
    if a.device_name:
        (run / "device.json").write_text(json.dumps({"type": "cuda", "name": a.device_name, "processes": 1}))
    pilot = autopilot(a.spec, run, a.scores, every) if a.scores else None
    if pilot is not None and start > 1 and pilot.on_checkpoint(start - 1, max_steps) is not None:
        start = max_steps + 1  # decided before the preemption: the run ends at the checkpoint it resumed from
    with open(run / "events.log", "a") as ev:
        ev.write(f"fake trainer: {n_examples} examples, steps {start}..{max_steps}\n")
        ev.write(f"HF_TOKEN {'present' if os.environ.get('HF_TOKEN') else 'absent'}\n")
    with open(run / "metrics.jsonl", "a") as metrics:
        for step in range(start, max_steps + 1):
            if a.hang_at is not None and step == a.hang_at:
                time.sleep(3600)
            time.sleep(a.step_s)
            if a.fail_at is not None and step == a.fail_at:
                print(f"boom at step {step}", file=sys.stderr)
                return 3
            # the engine's train record (engine/loop.py fit: step, total_steps, loss, step_time_s, ...)
            # (and the "time" engine/metrics.py MetricsWriter stamps on every record)
            loss = round(2.0 / step, 4)
            if chain is not None:
                chain, loss = chain_step(chain, step)
            rec = {"time": round(time.time(), 3), "step": step, "total_steps": max_steps, "loss": loss,
                   "examples": n_examples}
            if a.device_name:
                rec.update(step_time_s=a.step_s, mem_gb=round(5.0 + step / 100, 3))
            metrics.write(json.dumps(rec) + "\n")
            metrics.flush()
            if a.eval and ((run / "STOP").exists() or step % every == 0 or step == max_steps):
                lr = float(spec["train"].get("learning_rate", 2e-4))
                metrics.write(json.dumps({"step": step, "event": "eval", "val_loss": fake_val_loss(lr, step)}) + "\n")
                metrics.flush()
            if (run / "STOP").exists():
                save(run / "checkpoints" / f"step-{step}", step, chain, a.ckpt_mb, a.ckpt_write_s)
                print(f"STOP honoured at step {step}")
                return 0
            if step % every == 0:
                save(run / "checkpoints" / f"step-{step}", step, chain, a.ckpt_mb, a.ckpt_write_s)
                if pilot is not None and pilot.on_checkpoint(step, max_steps) is not None:
                    print(f"train.stop_when at step {step}", flush=True)
                    break  # the engine's way: end normally at this checkpoint (engine/loop.py)
            while step in gates and not gates[step].exists():
                time.sleep(0.05)
    tmp = run / ".tmp-adapter"
    tmp.mkdir(exist_ok=True)
    (tmp / "adapter_model.safetensors").write_bytes(
        b"fake-adapter-" + (chain.encode() if chain is not None else str(max_steps).encode()) * 1000)
    (tmp / "adapter_config.json").write_text(json.dumps({"r": 8, "steps": max_steps}))
    os.replace(tmp, run / "adapter")
    print("done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
