"""STAND-IN for kohya sd-scripts' sdxl_train_network.py (tests only; trains nothing).

It accepts exactly the options the pinned parser has (from the recorded contract: an unknown
flag exits 2 like argparse), reads the dataset TOML, and writes sd-scripts' real output layout
with fake weights, at a few steps per second:
  stdout   ``epoch N/M`` and the tqdm ``steps`` bar with ``avr_loss=`` (carriage returns)
  OUT/NAME-000001.safetensors, OUT/NAME-000001-state/ (train_state.json) every N epochs
  OUT/NAME-step00000004.safetensors (+ -state) every N steps
  OUT/sample/NAME_e000001_00_<stamp>.png when sample prompts are given
  OUT/NAME.safetensors at the end, and with ``--save_state`` the final state OUT/NAME-state/
  (train_util.save_state_on_train_end, LAST_STATE_NAME "{}-state"; train_state.json as every state)
``--resume DIR`` continues after the epoch/step in DIR/train_state.json, counting its steps as sd-scripts does (from the step within that epoch). With
``--cache_text_encoder_outputs`` and caption shuffle or dropout in the dataset it fails as
SdxlNetworkTrainer.assert_extra_args does (sdxl_train_network.py at 48d368fa, its message verbatim). The pace comes from
LORAPOD_STANDIN_STEP_S (default 0.1 s).
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
import tomllib
from pathlib import Path

CONTRACT = Path(__file__).resolve().parents[3] / "src/lorapod/trainers/contracts/kohya_sd_scripts.json"


def parse(argv: list[str]) -> dict:
    opts = {f: o for o in json.loads(CONTRACT.read_text())["scripts"]["sdxl_train_network.py"]["options"]
            for f in o["flags"]}
    args: dict = {}
    i = 0
    while i < len(argv):
        flag = argv[i]
        o = opts.get(flag)
        if o is None:
            print(f"sdxl_train_network.py: error: unrecognized arguments: {flag}", file=sys.stderr)
            sys.exit(2)
        i += 1
        if o["action"] == "store_true":
            args[o["dest"]] = True
            continue
        vals = []
        while i < len(argv) and not argv[i].startswith("--"):
            vals.append(argv[i])
            i += 1
        args[o["dest"]] = vals if o["nargs"] in ("*", "+") else vals[0]
    return args


def weights(path: Path, tag: str) -> None:
    tmp = path.with_name(path.name + ".partial")
    tmp.write_bytes(tag.encode() * 2048)
    os.replace(tmp, path)


def state(path: Path, epoch: int, step: int) -> None:
    path.mkdir(exist_ok=True)
    (path / "optimizer.bin").write_bytes(b"o" * 4096)
    (path / "train_state.json").write_text(json.dumps({"current_epoch": epoch, "current_step": step}))


def main() -> int:
    a = parse(sys.argv[1:])
    ds = tomllib.loads(Path(a["dataset_config"]).read_text())
    general = ds.get("general", {})
    if a.get("cache_text_encoder_outputs") and (general.get("shuffle_caption") or general.get("caption_dropout_rate")):
        raise AssertionError(
            "when caching Text Encoder output, either caption_dropout_rate, shuffle_caption, token_warmup_step or "
            "caption_tag_dropout_rate cannot be used / Text Encoderの出力をキャッシュするときはcaption_dropout_rate, "
            "shuffle_caption, token_warmup_step, caption_tag_dropout_rateは使えません")
    per_epoch = 0
    for d in ds["datasets"]:
        for s in d["subsets"]:
            n = sum(1 for f in Path(s["image_dir"]).iterdir() if f.suffix in (".png", ".jpg"))
            per_epoch += math.ceil(n * s.get("num_repeats", 1) / d.get("batch_size", 1))
    epochs = int(a.get("max_train_epochs", 1))
    total = per_epoch * epochs
    out, name = Path(a["output_dir"]), a["output_name"]
    out.mkdir(parents=True, exist_ok=True)
    every_e, every_s = int(a.get("save_every_n_epochs", 0)), int(a.get("save_every_n_steps", 0))
    step, first_epoch, skip = 0, 0, 0
    bar, bar_total = 0, total
    if a.get("resume"):
        st = json.loads((Path(a["resume"]) / "train_state.json").read_text())
        step = st["current_step"]
        first_epoch, skip = divmod(step, per_epoch)
        print(f"resumed from {a['resume']}: epoch {first_epoch + 1}, step {step}")
        # train_network.py (--skip_until_initial_step): whole epochs skipped, then global_step =
        # the step within the epoch; its bar counts from 0 to max_train_steps - that (the real
        # run: tests/recorded/sd15/resume.log)
        step = skip
    bar, bar_total = 0, total - step
    pace = float(os.environ.get("LORAPOD_STANDIN_STEP_S", "0.1"))
    t0 = time.time()
    for epoch in range(first_epoch, epochs):
        print(f"\nepoch {epoch + 1}/{epochs}", flush=True)
        for _ in range(per_epoch - skip):
            time.sleep(pace)
            step += 1
            bar += 1
            loss = 0.2 / math.sqrt(step)
            el = time.time() - t0
            sys.stdout.write(f"\rsteps: {100 * bar // bar_total:3d}%|{'#' * (10 * bar // bar_total):10s}| {bar}/{bar_total} "
                             f"[00:{int(el):02d}<00:00, {bar / max(el, 1e-3):5.2f}it/s, avr_loss={loss:.3g}]")
            sys.stdout.flush()
            if every_s and step % every_s == 0 and step < total:
                weights(out / f"{name}-step{step:08d}.safetensors", f"s{step}")
                state(out / f"{name}-step{step:08d}-state", epoch, step)
        skip = 0
        if every_e and (epoch + 1) % every_e == 0 and epoch + 1 < epochs:
            weights(out / f"{name}-{epoch + 1:06d}.safetensors", f"e{epoch + 1}")
            state(out / f"{name}-{epoch + 1:06d}-state", epoch + 1, step)
            if a.get("sample_prompts"):
                (out / "sample").mkdir(exist_ok=True)
                for i, _ in enumerate(Path(a["sample_prompts"]).read_text().splitlines()):
                    (out / "sample" / f"{name}_e{epoch + 1:06d}_{i:02d}_20261201000000.png").write_bytes(b"\x89PNG fake")
    weights(out / f"{name}.safetensors", "final")
    if a.get("save_state"):
        state(out / f"{name}-state", epochs, step)
    print("\nmodel saved.", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
