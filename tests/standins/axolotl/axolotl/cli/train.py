"""STAND-IN for ``python -m axolotl.cli.train CONFIG`` (tests only; trains nothing).

Put ``tests/standins/axolotl`` first on PYTHONPATH and it shadows axolotl for that process. It
reads the YAML and writes the Hugging Face Trainer's layout under ``output_dir``:
``checkpoint-<step>/`` (adapter_model.safetensors, trainer_state.json) every ``save_steps``, at
most ``save_total_limit`` of them; a checkpoint right away when ``axolotl_checkpoint.save``
appears there (axolotl's dynamic checkpoint, ``dynamic_checkpoint.enabled``; the file is
removed); the final adapter_model.safetensors + adapter_config.json. It prints the Trainer's log
dicts (floats as ``.4g`` strings, transformers 5.x ProgressCallback.on_log) and a bare tqdm bar.
One step per LORAPOD_STANDIN_STEP_S seconds (default 0.02).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path

import yaml


def checkpoint(out: Path, step: int, limit: int | None) -> None:
    ck = out / f"checkpoint-{step}"
    ck.mkdir(exist_ok=True)
    (ck / "adapter_model.safetensors").write_bytes(b"a" * 1024)
    (ck / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    if limit:
        cks = sorted(out.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))
        for old in cks[:-limit]:
            shutil.rmtree(old)


def main() -> int:
    cfg = yaml.safe_load(Path(sys.argv[1]).read_text())
    out = Path(cfg["output_dir"])
    out.mkdir(parents=True, exist_ok=True)
    lines = sum(len(Path(d["path"]).read_text().splitlines()) for d in cfg["datasets"])
    total = cfg.get("max_steps") or int(lines * cfg["num_epochs"] // (cfg["micro_batch_size"] * cfg["gradient_accumulation_steps"]))
    start = 0
    if cfg.get("resume_from_checkpoint"):
        start = json.loads((Path(cfg["resume_from_checkpoint"]) / "trainer_state.json").read_text())["global_step"]
    trigger = out / "axolotl_checkpoint.save"
    pace = float(os.environ.get("LORAPOD_STANDIN_STEP_S", "0.02"))
    for step in range(start + 1, total + 1):
        time.sleep(pace)
        sys.stdout.write(f"\r{100 * step // total:3d}%|#| {step}/{total} [00:01<00:01,  9.00it/s]")
        print(str({"loss": f"{2.0 / step:.4g}", "grad_norm": "0.5", "learning_rate": f"{cfg['learning_rate']:.4g}",
                   "epoch": f"{step / total * cfg['num_epochs']:.4g}"}), flush=True)
        if cfg.get("save_steps") and step % cfg["save_steps"] == 0:
            checkpoint(out, step, cfg.get("save_total_limit"))
        if trigger.exists() and (cfg.get("dynamic_checkpoint") or {}).get("enabled"):
            trigger.unlink()
            checkpoint(out, step, cfg.get("save_total_limit"))
    (out / "adapter_model.safetensors").write_bytes(b"final")
    (out / "adapter_config.json").write_text(json.dumps({"r": cfg["lora_r"]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
