"""A real training run of a trainer on CPU through lorapod's job wrapper, recorded as fixtures.

    python tools/upstream/cpu_run.py axolotl [--record | --quick]   # under a Python with axolotl's training deps
                                                                     # (tools/upstream/axolotl-cpu.txt)

Builds the smallest model the trainer accepts in code (axolotl: a 2-layer Llama of hidden size
32 with a tokenizer trained on the demo's chats, random weights, lorapod.demo), writes a spec
for it, and runs ``run_trainer`` (what ``lorapod trainer-run`` runs on an instance) three times:
two steps to the end; four steps with STOP written after the first metric (axolotl's
dynamic-checkpoint trigger, then the wrapper ends it); and ``--resume`` from the checkpoint the
stop left. With ``--record`` the trainer's own output (bytes as it printed them, \\r included,
the work folder's path written as /w) and the files it wrote go to tests/recorded/<trainer>/,
where tests/test_trainers_recorded.py checks lorapod's bridge and output mapping against them.

One change to the job, for CPU only: axolotl 0.19.0 switches its Triton LoRA kernels on by itself
(utils/schemas/config.py: lora_mlp/qkv/o/embedding_kernel default to True for a LoRA), and those
kernels need a GPU; the run sets them false. Nothing else of the job is touched.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
RECORDED = REPO / "tests" / "recorded"

CHILD = r'''
import sys
from pathlib import Path
from lorapod.spec import load_spec
from lorapod.trainers.axolotl import Axolotl
from lorapod.trainers.job import dump_yaml
from lorapod.trainers.runner import run_trainer

build = Axolotl.build


def cpu_build(self, spec, layout, **kw):  # see the module docstring: GPU-only kernels off
    job = build(self, spec, layout, **kw)
    job.config.update({k: False for k in ("lora_mlp_kernel", "lora_qkv_kernel", "lora_o_kernel",
                                          "lora_embedding_kernel")})
    job.files[next(p for p in job.files if p.endswith("axolotl.yaml"))] = dump_yaml(job.config)
    return job


Axolotl.build = cpu_build
work = Path(sys.argv[2])
state = run_trainer(load_spec(Path(sys.argv[1])), "axolotl", work / "run", work, python=sys.executable,
                    src=sys.argv[3], poll_s=0.2, stop_wait_s=120)
print(f"lorapod trainer-run: {state}", flush=True)
'''


def axolotl_spec(root: Path, steps: int) -> Path:
    import yaml

    sys.path.insert(0, str(REPO / "src"))
    from lorapod import demo
    from lorapod.builtin import llm

    train, val = llm.build_dataset()
    model = root / "base"
    if not model.is_dir():
        llm.build_base_model(model, llm.demo_texts(train, val), hidden=32, layers=2)
        demo.write_jsonl(root / "chats.jsonl", train)
    spec = {"model": {"id": str(model), "family": "llm"},
            "method": {"type": "lora", "r": 4, "alpha": 8, "dropout": 0.0, "target_modules": "all-linear"},
            "data": {"path": str(root / "chats.jsonl"), "format": "messages", "sequence_len": 128,
                     "packing": False, "val_split": 0.1},
            "train": {"max_steps": steps, "micro_batch_size": 2, "grad_accum": 1, "optimizer": "adamw",
                      "precision": "fp32", "learning_rate": 1e-3, "scheduler": "constant",
                      "gradient_checkpointing": False, "seed": 7},
            "save": {"every_steps": 1, "every_epochs": None, "keep_last": 2},
            "output": {"dir": str(root / "runs"), "name": "chat"}}
    path = root / f"spec-{steps}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def run(spec: Path, work: Path, stop_after_metric: bool = False) -> tuple[int, bytes, float]:
    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "HF_HUB_OFFLINE": "1", "AXOLOTL_DO_NOT_TRACK": "1",
           "TOKENIZERS_PARALLELISM": "false"}
    t0 = time.monotonic()
    work.mkdir(parents=True, exist_ok=True)  # axolotl writes last_run_prepared/ into its working directory
    proc = subprocess.Popen([sys.executable, "-c", CHILD, str(spec), str(work), sys.prefix], env=env, cwd=work,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    out = b""
    metrics = work / "run" / "metrics.jsonl"
    assert proc.stdout is not None
    os.set_blocking(proc.stdout.fileno(), False)
    while proc.poll() is None:
        out += proc.stdout.read() or b""
        if stop_after_metric and metrics.is_file() and metrics.read_text().strip():
            (work / "run" / "STOP").write_text("cpu_run\n")
            stop_after_metric = False
        time.sleep(0.1)
    out += proc.stdout.read() or b""
    return proc.returncode, out, time.monotonic() - t0


def listing(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) + ("/" if p.is_dir() else "") for p in root.rglob("*"))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("trainer", choices=["axolotl"])
    ap.add_argument("--record", action="store_true")
    ap.add_argument("--quick", action="store_true", help="the two-step run only (what CI runs)")
    ns = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="lorapod-cpu-run-") as tmp_s:
        root = Path(tmp_s)
        results = {}
        plan = (("two-steps", 2, False),) if ns.quick else (("two-steps", 2, False), ("stop", 4, True))
        for name, steps, stop in plan:
            work = root / name
            rc, out, secs = run(axolotl_spec(root, steps), work, stop_after_metric=stop)
            results[name] = (work, rc, out, secs)
            print(f"{name}: exit {rc} in {secs:.0f} s; {out.decode(errors='replace').splitlines()[-1]}")
        if ns.quick:
            return 0 if results["two-steps"][1] == 0 else 1
        work = root / "stop"
        (work / "run" / "STOP").unlink()  # a resumed job starts without the stop that ended the last one
        rc, out, secs = run(axolotl_spec(root, 4), work)  # the same folder: --resume from the stop
        results["resume"] = (work, rc, out, secs)
        print(f"resume: exit {rc} in {secs:.0f} s; {out.decode(errors='replace').splitlines()[-1]}")
        if ns.record:
            dest = RECORDED / ns.trainer
            dest.mkdir(parents=True, exist_ok=True)
            for name, (work, _rc, out, _secs) in results.items():
                text = out.replace(str(work).encode(), b"/w").replace(str(root).encode(), b"/r")
                (dest / f"{name}.log").write_bytes(text)
            def metrics(work: Path) -> list[dict]:
                return [{k: v for k, v in json.loads(x).items() if k != "time"}
                        for x in (work / "run" / "metrics.jsonl").read_text().splitlines()]

            two, stopped = results["two-steps"][0], results["resume"][0]
            (dest / "files.json").write_text(json.dumps({
                "trainer_out": listing(two / "trainer" / "out"), "run": listing(two / "run"),
                "metrics": metrics(two), "stop_then_resume": {"run": listing(stopped / "run"),
                                                              "metrics": metrics(stopped)},
                "seconds": {k: round(v[3]) for k, v in results.items()}}, indent=1) + "\n")
            print(f"recorded in {dest.relative_to(REPO)}")
        return 0 if all(r[1] == 0 for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
