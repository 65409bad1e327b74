"""lorapod's emitted jobs, run through the trainers' own code at the pinned commits.

    python tools/upstream_check.py fetch  [--dir /tmp/up]           # print how to get the checkouts
    python tools/upstream_check.py check  [--dir /tmp/up] [--python-sd-scripts PY ...]
    python tools/upstream_check.py record [--dir /tmp/up] [...]     # check, then rewrite the records

``--dir`` holds checkouts of sd-scripts, musubi-tuner and ai-toolkit at the commits the adapters
pin (a git checkout, or an export with the commit in a ``.lorapod-commit`` file); axolotl is the
pip package in its Python. Each trainer's code runs in a subprocess under its own Python (a CPU
virtualenv with its requirements; default: this one), through tools/upstream/probes.py.

For every example x trainer pair and the variants that reach the adapters' other branches, the
job lorapod would run (built from real files: PNGs, 30 fps clips, chat JSONL) goes through the
trainer's parser, verifiers, dataset sanitizer and builder, config loader and classes, scheduler,
gradient clipping and logger; every place where the trainer reads it otherwise than lorapod
means is printed as a MISMATCH. Variants lorapod refuses are built anyway and must fail in the
trainer with the text lorapod quotes. ``record`` also rewrites, from the same checkouts, the parts
of trainers/contracts/*.json lorapod's checks read (argparse options, dataset schemas, ai-toolkit
config fields and archs, axolotl's JSON schema) and tests/recorded/. Exit status 1 on a mismatch,
2 when a checkout or a Python is missing.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from lorapod.spec import validate  # noqa: E402
from lorapod.trainers import get, prepare  # noqa: E402
from lorapod.trainers.base import Layout, TrainerRefused  # noqa: E402
from lorapod.trainers.runner import write_files  # noqa: E402

PROBES = REPO / "tools" / "upstream" / "probes.py"
CONTRACTS = REPO / "src" / "lorapod" / "trainers" / "contracts"
RECORDED = REPO / "tests" / "recorded"
CHECKOUTS = {"sd-scripts": "sd-scripts", "musubi-tuner": "musubi-tuner", "ai-toolkit": "ai-toolkit"}
TIMEOUT_S = 900  # one trainer's probe, all its cases (imports of torch/diffusers on two cores)


def fetch_commands(root: Path) -> list[str]:
    """How to get the checkouts at the pinned commits (the public repositories)."""
    cmds = []
    for name, folder in CHECKOUTS.items():
        t = get(name)
        d = root / folder
        cmds.append(f"git clone --filter=blob:none {t.repo} {d} && git -C {d} checkout {t.commit}")
    return cmds


def checkout_commit(path: Path) -> str | None:
    marker = path / ".lorapod-commit"
    if marker.is_file():
        return marker.read_text().strip()
    try:
        return subprocess.run(["git", "-C", str(path), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=30, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None


# ------------------------------------------------------------------ data, specs, cases


def make_data(root: Path) -> dict[str, Path]:
    """Real files of each kind the examples train on."""
    import numpy as np
    from PIL import Image

    from lorapod.data.clips import write_clip

    rng = np.random.default_rng(0)
    images, clips = root / "mug", root / "clips"
    images.mkdir(parents=True)
    clips.mkdir()
    for i in range(4):
        Image.fromarray(rng.integers(0, 255, (64, 64, 3), dtype=np.uint8)).save(images / f"img{i}.png")
        (images / f"img{i}.txt").write_text("zxq_mug, a mug on a table")
    for i in range(2):
        Image.fromarray(rng.integers(0, 255, (64, 64, 3), dtype=np.uint8)).save(clips / f"still{i}.png")
        (clips / f"still{i}.txt").write_text("zxq standing")
        frames = [rng.integers(0, 255, (64, 64, 3), dtype=np.uint8) for _ in range(60)]  # 2 s at 30 fps
        write_clip(clips / f"clip{i}.mp4", frames, fps=30.0)
        (clips / f"clip{i}.txt").write_text("zxq walking")
    chat = root / "chats.jsonl"
    chat.write_text((REPO / "examples" / "data" / "fruit-colours.jsonl").read_text())
    val = root / "chats-val.jsonl"
    val.write_text((REPO / "examples" / "data" / "fruit-colours-val.jsonl").read_text())
    return {"images": images, "clips": clips, "chat": chat, "val": val}


@dataclass
class Case:
    name: str
    trainer: str
    raw: dict[str, Any]
    refusal: str | None = None  # lorapod refuses it; the trainer must fail with this text
    facts: dict[str, Any] = field(default_factory=dict)


def _example(name: str, data: dict[str, Path], **over) -> dict:
    import yaml

    raw = yaml.safe_load((REPO / "examples" / f"{name}.yaml").read_text())
    raw.setdefault("data", {})["path"] = str(data["chat"] if raw["model"]["family"] == "llm"
                                             else data["clips"] if "clips" in name else data["images"])
    for dotted, value in over.items():
        node = raw
        *parents, last = dotted.split("__")
        for p in parents:
            node = node.setdefault(p, {})
        node[last] = value
    raw.setdefault("output", {})["dir"] = str(data["images"].parent / "runs")
    return raw


def cases(data: dict[str, Path]) -> list[Case]:
    ex = _example
    flux1 = {"model__id": "black-forest-labs/FLUX.1-dev", "model__family": "flux1", "model__variant": "dev",
             "model__dtype": "fp8"}
    sd15 = {"model__id": "stable-diffusion-v1-5/stable-diffusion-v1-5", "model__family": "sd15",
            "data__cache_text_encoder_outputs": False}
    return [
        Case("sdxl-object-lora", "sd-scripts", ex("sdxl-object-lora", data)),
        Case("sdxl-object-lora", "ai-toolkit", ex("sdxl-object-lora", data)),
        Case("flux2-klein-lora", "ai-toolkit", ex("flux2-klein-lora", data)),
        Case("wan21-video-lora", "musubi-tuner", ex("wan21-video-lora", data)),
        Case("wan21-video-clips", "musubi-tuner", ex("wan21-video-clips", data)),
        Case("llm-chat-lora", "axolotl", ex("llm-chat-lora", data)),
        # variants reaching the adapters' other branches
        Case("flux1-fp8-shift-swap", "sd-scripts", ex("sdxl-object-lora", data, **flux1, train__timestep_sampling="shift",
                                                      train__blocks_to_swap=8)),
        Case("sd15-steps-ratio-decay", "sd-scripts", ex(
            "sdxl-object-lora", data, **sd15, train__max_steps=40, train__warmup_ratio=0.1, train__warmup_steps=0,
            train__weight_decay=0.01, train__grad_accum=2, train__scheduler="linear", method__dropout=0.1,
            data__flip=True, data__shuffle_captions=True, save__every_steps=10, save__every_epochs=None,
            save__keep_last=2)),
        Case("sdxl-steps-keep3-cosine", "sd-scripts", ex(
            "sdxl-object-lora", data, train__max_steps=50, train__scheduler="cosine", save__every_steps=10,
            save__every_epochs=None, save__keep_last=3, train__max_grad_norm=None)),
        Case("sdxl-te-cache-shuffle", "sd-scripts", ex("sdxl-object-lora", data, data__shuffle_captions=True),
             refusal="when caching Text Encoder output, either caption_dropout_rate, shuffle_caption"),
        Case("sd15-te-cache", "sd-scripts", ex("sdxl-object-lora", data, **{**sd15, "data__cache_text_encoder_outputs": True}),
             refusal="SystemExit: 2"),  # argparse: unrecognized arguments: --cache_text_encoder_outputs
        Case("flux1-24gb", "ai-toolkit", ex("sdxl-object-lora", data, **flux1, compute__gpu="RTX 4090")),
        Case("klein-linear-noclip", "ai-toolkit", ex("flux2-klein-lora", data, train__scheduler="linear",
                                                     train__warmup_steps=0, train__max_steps=20,
                                                     train__max_grad_norm=None)),
        Case("klein-cosine", "ai-toolkit", ex("flux2-klein-lora", data, train__scheduler="cosine", train__warmup_steps=0,
                                              train__max_steps=20)),
        Case("wan-steps-ratio-cosine-keep2", "musubi-tuner", ex(
            "wan21-video-lora", data, train__max_steps=30, train__warmup_ratio=0.1, train__scheduler="cosine",
            save__every_steps=10, save__every_epochs=None, save__keep_last=2)),
        Case("wan-clips-all-frames", "musubi-tuner", ex("wan21-video-clips", data, data__fps=None)),
        Case("zimage-musubi-lora", "musubi-tuner", ex("zimage-musubi-lora", data)),
        Case("qwenimage-musubi-lora", "musubi-tuner", ex("qwenimage-musubi-lora", data)),
        Case("zimage-turbo-steps-cosine-swap", "musubi-tuner", ex(
            "zimage-musubi-lora", data, model__variant="turbo", model__id="Tongyi-MAI/Z-Image-Turbo", train__max_steps=30,
            train__scheduler="cosine", train__blocks_to_swap=8, save__every_steps=10, save__keep_last=2)),
        Case("llm-lora-val-rslora-fp16-named", "axolotl", ex(
            "llm-chat-lora", data, method__type="lora", method__rslora=True, train__precision="fp16",
            method__target_modules=["q_proj", "v_proj"], data__val_path=str(data["val"]), train__optimizer="adamw")),
        Case("llm-noclip-nopack", "axolotl", ex("llm-chat-lora", data, train__max_grad_norm=None, data__packing=False)),
    ]


# ------------------------------------------------------------------ what lorapod means


def intended_rates(spec, steps: int) -> list[float]:
    """lorapod's schedules (the engine's meaning of train.scheduler): warm-up to the rate, then
    constant, linear to 0 or cosine to 0 over the remaining steps."""
    import math

    t = spec.train
    lr, warm = t.learning_rate, t.warmup_steps or int(t.warmup_ratio * steps)
    out = []
    for s in range(steps):
        if s < warm and t.scheduler != "constant":
            out.append(lr * s / max(1, warm))
            continue
        p = (s - warm) / max(1, steps - warm)
        out.append({"constant": lr, "constant_with_warmup": lr, "linear": lr * (1 - p),
                    "cosine": lr * 0.5 * (1 + math.cos(math.pi * p))}[t.scheduler])
    return out


def close(a: list[float], b: list[float], rel: float = 0.02) -> bool:
    scale = max(max(map(abs, b), default=0.0), 1e-12)
    return len(a) == len(b) and all(abs(x - y) <= rel * scale for x, y in zip(a, b, strict=True))


class Report:
    def __init__(self) -> None:
        self.mismatches: list[str] = []
        self.passed: list[str] = []
        self.skipped: list[str] = []

    def check(self, where: str, ok: bool, what: str) -> None:
        (self.passed if ok else self.mismatches).append(f"{where}: {what}")


def _stage_ok(rep: Report, where: str, out: dict, stages: list[str]) -> None:
    for st in stages:
        got = out.get(st)
        if got is None:
            continue
        rep.check(where, got["ok"], f"{st}" + ("" if got["ok"] else f" failed: {got['error']} ({got['at']})"))


def build(case: Case, work: Path):
    """The job lorapod would run for the case; for a refused case, the job built past the refusal."""
    spec = validate(case.raw)
    layout = Layout(str(work / case.trainer / case.name))
    try:
        trainer, job = prepare(spec, case.trainer, layout)
        refused = None
    except TrainerRefused as exc:
        trainer, refused = get(case.trainer), str(exc)
        job = trainer.build(spec, layout)
    except KeyError as exc:  # a script the contract does not record yet: `record` is about to
        print(f"   {case.name}: {exc.args[0]}; built without the contract check")
        trainer, refused = get(case.trainer), None
        job = trainer.build(spec, layout)
    write_files(job)
    for d in (layout.out, layout.logs, layout.models):
        Path(d).mkdir(parents=True, exist_ok=True)
    if case.trainer == "musubi-tuner":
        _stand_in_dit(job)
    return spec, trainer, job, refused


def _stand_in_dit(job) -> None:
    """The DiT file the prepare step downloads, stood in by one tensor: musubi's
    handle_model_specific_args reads only its dtype (wan/modules/model.py detect_wan_sd_dtype, key
    ``blocks.0.cross_attn.k.weight``); Comfy-Org's repackaged file is bf16, as its name says."""
    import torch
    from safetensors.torch import save_file

    argv = job.train_command().argv
    dit = Path(argv[argv.index("--dit") + 1])
    dit.parent.mkdir(parents=True, exist_ok=True)
    save_file({"blocks.0.cross_attn.k.weight": torch.zeros(2, 2, dtype=torch.bfloat16)}, str(dit))


def request_for(case: Case, spec, job) -> dict:
    from lorapod.trainers.base import total_steps

    steps = total_steps(spec, 4) or 40
    req: dict[str, Any] = {"name": case.name}
    train = next((c for c in job.commands if c.phase == "train"), None)
    if case.trainer in ("sd-scripts", "musubi-tuner"):
        at = next(i for i, a in enumerate(train.argv) if a.endswith(train.script))
        req.update(script=train.script, argv=train.argv[at + 1:], steps=min(steps, 200),
                   read=["max_grad_norm", "lr_warmup_steps", "save_last_n_steps", "save_last_n_steps_state",
                         "network_dropout", "max_train_steps", "max_train_epochs", "fp8_base", "blocks_to_swap",
                         "timestep_sampling", "discrete_flow_shift"])
        if case.trainer == "musubi-tuner":
            req["prepare"] = {c.script: c.argv[next(i for i, a in enumerate(c.argv) if a.endswith(c.script)) + 1:]
                              for c in job.commands if c.phase == "prepare" and c.script}
    elif case.trainer == "ai-toolkit":
        req["config_path"] = next(p for p in job.files if p.endswith("config.yaml"))
    else:
        req["config"] = job.config
    return req


def judge(rep: Report, case: Case, spec, trainer, job, refused: str | None, out: dict) -> None:
    where = f"{case.name} x {case.trainer}"
    if refused is not None or case.refusal is not None:
        failures = [v.get("error", "") for v in out.values() if isinstance(v, dict) and v.get("ok") is False]
        said = " ".join((refused or "NOT refused").split())[:100]
        rep.check(where, refused is not None, f"lorapod refuses it before renting ({said}...)")
        rep.check(where, any(case.refusal in f for f in failures),
                  f"the trainer fails with {case.refusal!r}" + ("" if failures else ": it accepted the job"))
        if refused and case.refusal and case.refusal.startswith("when caching"):
            rep.check(where, case.refusal in refused, "lorapod's refusal quotes the trainer's words")
        return
    from lorapod.trainers.base import total_steps

    steps = min(total_steps(spec, 4) or 40, 200)
    if case.trainer == "sd-scripts":
        _stage_ok(rep, where, out, ["parse", "verify", "dataset", "assert_extra_args", "names", "kept_steps", "schedule"])
        ds = out.get("dataset", {}).get("value") or {}
        rep.check(where, ds.get("images") == 4 * spec.data.repeats, f"dataset images x repeats = {ds.get('images')} "
                  f"(lorapod: {4 * spec.data.repeats})")
        _kohya_common(rep, where, spec, trainer, out, steps)
    elif case.trainer == "musubi-tuner":
        _stage_ok(rep, where, out, [k for k in out if k.startswith("parse")] + ["model_args", "dataset", "kept_steps",
                                                                                "names"])
        items = out.get("dataset", {}).get("value") or []
        names = {i["item"].split("_")[0] for i in items}
        folder = Path(str(spec.data_paths()[0]))
        media = sorted(f.stem for f in folder.iterdir() if f.suffix in (".png", ".mp4"))
        rep.check(where, sorted(names) >= sorted({m.split("_")[0] for m in media}) or names >= set(media),
                  f"every clip and still becomes an item (found {sorted(names)}, folder {media})")
        clip_frames = [i["frames"] for i in items if i["item"].startswith("clip")]
        if clip_frames:
            allowed = 32 if spec.data.fps else 60  # 60 frames at 30 fps: 32 at Wan's 16 fps
            rep.check(where, max(clip_frames) <= allowed and max(clip_frames) in spec.data.target_frames,
                      f"clip windows {sorted(set(clip_frames))} frames (the clips hold {allowed} at the trained rate)")
        _kohya_common(rep, where, spec, trainer, out, steps)
    elif case.trainer == "ai-toolkit":
        _stage_ok(rep, where, out, [k for k in out if isinstance(out[k], dict) and "ok" in out[k]])
        rep.check(where, out.get("unread_keys") == [], f"every emitted key is read (unread: {out.get('unread_keys')})")
        rep.check(where, out.get("arch_registered") is True, "model.arch is one ai-toolkit registers")
        got = out.get("schedule", {}).get("value")
        if got is not None:
            want = intended_rates(spec, len(got))
            rep.check(where, close(got, want), f"{spec.train.scheduler} schedule as lorapod means it "
                      f"(first/last {got[0]:.3g}/{got[-1]:.3g}, lorapod {want[0]:.3g}/{want[-1]:.3g})")
        clip = out.get("clip", {}).get("value")
        if clip is not None:
            expect = [30.0, 40.0] if spec.train.max_grad_norm is None else [30.0 * spec.train.max_grad_norm / 50,
                                                                             40.0 * spec.train.max_grad_norm / 50]
            rep.check(where, close(clip, expect, 1e-3), f"clipping as train.max_grad_norm={spec.train.max_grad_norm} "
                      f"(a 50-norm gradient becomes {clip})")
        db = out.get("logger", {}).get("value")
        if db:
            from lorapod.trainers.bridge import AiToolkitSqlite

            recs = AiToolkitSqlite(Path(db)).poll()
            rep.check(where, [r.get("loss") for r in recs] == [0.5, 0.4375],
                      f"ai-toolkit's UILogger database reaches metrics.jsonl with the loss ({recs})")
        sample = out.get("sample_config", {}).get("value")
        if sample and spec.model.family == "flux2":
            rep.check(where, (sample["guidance_scale"], sample["sample_steps"]) == (4.0, 30),
                      f"klein samples at guidance/steps {sample}")
    elif case.trainer == "axolotl":
        _stage_ok(rep, where, out, ["validate_config"])
        rep.check(where, out.get("dropped") == [], f"no key dropped ({out.get('dropped')})")
        rep.check(where, not any("decontamination" in w for w in out.get("warnings", [])),
                  "packed examples are isolated (no decontamination warning)")
        v = out.get("validate_config", {}).get("value") or {}
        want = spec.train.max_grad_norm or 0.0
        rep.check(where, v.get("max_grad_norm") == want, f"max_grad_norm {v.get('max_grad_norm')} (lorapod: {want}; "
                  "transformers clips only when > 0)")


def _kohya_common(rep: Report, where: str, spec, trainer, out: dict, steps: int) -> None:
    args = out.get("args", {})
    rep.check(where, args.get("max_grad_norm") == (spec.train.max_grad_norm or 0.0),
              f"max_grad_norm {args.get('max_grad_norm')} (0 turns clipping off)")
    kept = out.get("kept_steps", {}).get("value")
    if kept is not None:
        every = spec.save.every_steps
        want = [s for s in range(every, steps + 1, every)][-spec.save.keep_last:]
        rep.check(where, kept == want, f"step saves kept on disk {kept} (save.keep_last {spec.save.keep_last}: {want})")
    names = out.get("names", {}).get("value")
    if names:
        with tempfile.TemporaryDirectory() as tmp:
            lay = Layout(tmp)
            Path(lay.out).mkdir(parents=True)
            for kind, n in names.items():
                p = Path(lay.out) / n
                (p.mkdir() if kind.endswith("state") else p.write_bytes(b"w"))
            found = {(a.kind, a.key) for a in trainer.artifacts(lay, spec_name(spec))}
        want = {("final", f"{spec_name(spec)}.safetensors"), ("checkpoint", "epoch-2"), ("checkpoint", "step-500")}
        if "epoch_state" in names:
            want |= {("state", "epoch-2"), ("state", "step-500"), ("state", "last")}
        rep.check(where, found == want, f"the trainer's output names map to lorapod's run folder ({sorted(found)})")
    got = out.get("schedule", {}).get("value")
    if got is not None:
        want = intended_rates(spec, len(got))
        rep.check(where, close(got, want), f"{spec.train.scheduler} schedule as lorapod means it")


def spec_name(spec) -> str:
    from lorapod.trainers.base import safe_name

    return safe_name(spec)


# ------------------------------------------------------------------ records


def write_records(results: dict[str, dict], root: Path = REPO) -> list[str]:
    """Rewrite the parts of the contracts lorapod's checks read, and tests/recorded/, from the probes
    (into ``root``, a copy of the repository's layout; the repository itself by default)."""
    changed = []
    contracts, recorded = root / CONTRACTS.relative_to(REPO), root / RECORDED.relative_to(REPO)

    def save(path: Path, text: str) -> None:
        original = REPO / path.relative_to(root)
        if path.suffix == ".json" and original.is_file():
            before = original.read_text()
            if "\n" not in before.rstrip("\n"):  # a one-line record stays one line
                text = json.dumps(json.loads(text), separators=(",", ":"), ensure_ascii=False)
            if not before.endswith("\n"):
                text = text.rstrip("\n")  # the recorded files end without a newline
        if not original.is_file() or original.read_text() != text:
            changed.append(str(path.relative_to(root)))  # differs from the repository's record
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)

    for trainer, contract in (("sd-scripts", "kohya_sd_scripts.json"), ("musubi-tuner", "kohya_musubi_tuner.json")):
        res = results.get(trainer)
        if not res or "parsers" not in res:
            continue
        c = json.loads((CONTRACTS / contract).read_text())
        for script, options in res["parsers"].items():
            entry = c["scripts"].setdefault(script, {})
            entry["options"], entry["n_options"] = options, len(options)
        dc = c["dataset_config"]
        if trainer == "sd-scripts":
            for key, levels in res["dataset_schema"].items():
                dc.setdefault(key, {}).update(levels)
        else:
            dc.update(res["dataset_schema"])
        save(contracts / contract, json.dumps(c, indent=1, ensure_ascii=False) + "\n")
    res = results.get("ai-toolkit")
    if res and "config_fields" in res:
        c = json.loads((CONTRACTS / "ai_toolkit.json").read_text())
        for cls, fields in res["config_fields"].items():
            rec = c["config_classes"].setdefault(cls, {"fields": {}})
            old = rec.get("fields", {})
            if set(old) == set(fields):
                continue  # the recorded entries (with their annotations) stand
            kept = {k: v for k, v in old.items() if k in fields}  # keys the code no longer reads go
            for k, v in fields.items():
                if k not in kept:
                    kept[k] = {**v, "line": f"toolkit/config_modules.py:{v['line']}"}
            rec["fields"], rec["n_fields"] = kept, len(kept)
        if set(c["arch"]["registered_arch_values"]) != set(res["archs"]):
            c["arch"]["registered_arch_values"] = res["archs"]
        save(contracts / "ai_toolkit.json", json.dumps(c, indent=1, ensure_ascii=False) + "\n")
        save(recorded / "ai-toolkit" / "loss_log.sql", res["loss_log_sql"])
    res = results.get("axolotl")
    if res and "json_schema" in res:
        c = json.loads((CONTRACTS / "axolotl.json").read_text())
        c["json_schema_AxolotlInputConfig"] = res["json_schema"]
        save(contracts / "axolotl.json", json.dumps(c, indent=1, ensure_ascii=False) + "\n")
    return changed


# ------------------------------------------------------------------ main


def run_probe(trainer: str, checkout: Path | None, python: str, req: dict, tmp: Path) -> dict:
    rq, out = tmp / f"{trainer}.request.json", tmp / f"{trainer}.result.json"
    rq.write_text(json.dumps(req))
    proc = subprocess.run([python, str(PROBES), trainer, str(checkout) if checkout else "-", str(rq), str(out)],
                          capture_output=True, text=True, timeout=TIMEOUT_S)
    if proc.returncode != 0 or not out.is_file():
        raise RuntimeError(f"{trainer} probe exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    return json.loads(out.read_text())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("mode", choices=["fetch", "check", "record"])
    ap.add_argument("--dir", type=Path, default=Path("/tmp/up"), help="the folder holding the checkouts")
    for name in ("sd-scripts", "musubi-tuner", "ai-toolkit", "axolotl"):
        ap.add_argument(f"--python-{name}", default=sys.executable, help=f"the Python with {name}'s requirements")
    ap.add_argument("--only", action="append", help="run only these trainers")
    ap.add_argument("--out", type=Path, default=REPO, help="record: write the records under this folder "
                    "(the repository's layout) instead of into the repository")
    ns = ap.parse_args(argv)
    if ns.mode == "fetch":
        print("\n".join(fetch_commands(ns.dir)))
        return 0
    missing = []
    for name, folder in CHECKOUTS.items():
        d, want = ns.dir / folder, get(name).commit
        if not d.is_dir():
            missing.append(f"{name}: no checkout at {d}")
        elif checkout_commit(d) != want:
            missing.append(f"{name}: {d} is at {checkout_commit(d)}, not the pinned {want}")
    if missing and not ns.only:
        print("missing checkouts:\n  " + "\n  ".join(missing) + "\nget them with:\n  " +
              "\n  ".join(fetch_commands(ns.dir)))
        return 2
    rep = Report()
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="lorapod-upstream-") as tmp_s:
        tmp = Path(tmp_s)
        data = make_data(tmp / "data")
        built: dict[str, list] = {}
        for case in cases(data):
            if ns.only and case.trainer not in ns.only:
                continue
            spec, trainer, job, refused = build(case, tmp / "work")
            built.setdefault(case.trainer, []).append((case, spec, trainer, job, refused))
        for name, items in built.items():
            req = {"cases": [request_for(c, s, j) for c, s, _, j, _ in items], "record": ns.mode == "record"}
            python = getattr(ns, f"python_{name.replace('-', '_')}")
            checkout = ns.dir / CHECKOUTS[name] if name in CHECKOUTS else None
            print(f"== {name} ({len(items)} jobs) under {python}", flush=True)
            try:
                results[name] = run_probe(name, checkout, python, req, tmp)
            except (RuntimeError, subprocess.TimeoutExpired) as exc:
                rep.check(name, False, f"its code could not run here: {exc}")
                continue
            for case, spec, trainer, job, refused in items:
                judge(rep, case, spec, trainer, job, refused, results[name]["cases"].get(case.name, {}))
        if ns.mode == "record":
            changed = write_records(results, ns.out)
            print("records rewritten: " + (", ".join(changed) if changed else "none changed"))
    for line in rep.passed:
        print(f"ok        {line}")
    for line in rep.mismatches:
        print(f"MISMATCH  {line}")
    print(f"{len(rep.passed)} checks agree, {len(rep.mismatches)} mismatch(es)")
    return 1 if rep.mismatches else 0


if __name__ == "__main__":
    sys.exit(main())
