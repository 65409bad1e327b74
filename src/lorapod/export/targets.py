"""``lorapod export RUN --to TARGET``: one function per target, each writing a fresh folder.

LLM runs: peft, merged, gguf (llama.cpp adapter), ollama (merged GGUF + Modelfile).
Image runs: comfyui (kohya file), diffusers (pytorch_lora_weights), merged (fused pipeline).
Everything is written into a temporary folder that is renamed into place when complete; an
existing output folder is never overwritten.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from lorapod.errors import ExportError
from lorapod.export.names import IMAGE_TARGETS, LLM_TARGETS, choices
from lorapod.export.source import Source, open_source, output_dir


@dataclass
class Exported:
    out: Path
    files: list[str]
    notes: list[str] = field(default_factory=list)


def export_run(run: str | Path, to: str, checkpoint: int | None = None, out: Path | None = None,
               base: str | None = None, adapter_mode: bool = False, outtype: str = "f16",
               family: str | None = None, final: bool = False, record: bool = True) -> Exported:
    """Export ``run`` as ``to`` into ``out`` (default: the run folder's exports/). ``checkpoint`` None:
    the quality autopilot's pick when the run has one (quality/pick.json, its checkpoint here), else
    the final adapter; ``final``: the final adapter whatever was picked. ``record``: say it in the
    run's events log; ``--to hub`` stages its files with ``record=False`` and records only the upload
    that succeeded (a failed upload is no export)."""
    if Path(run).is_file():  # a LoRA file: convert kohya <-> diffusers
        from lorapod.export.convert import convert_file

        if not family:
            raise ExportError("converting a file needs --family (sd15, sdxl, flux1, flux2)")
        dest = Path(out) if out else Path(run).with_name(f"{Path(run).stem}-{to}")
        written = convert_file(Path(run), to, family, base, dest)
        return Exported(dest, [written.name], [f"converted {Path(run).name} to {to}"])
    picked = None
    if checkpoint is None and not final:
        from lorapod.export.source import quality_pick
        from lorapod.rundir import RunDir

        picked = quality_pick(RunDir.open(run))
        checkpoint = picked.step if picked is not None else None
    trained_by = _image_trainer(run)
    if trained_by:
        return _trainer_run(Path(run), trained_by, to, checkpoint, out)
    src = open_source(run, checkpoint)
    allowed = IMAGE_TARGETS if src.is_image else LLM_TARGETS
    if to not in allowed:
        kind = "an image" if src.is_image else "an LLM"
        raise ExportError(f"--to {to} is not available for {kind} run", hint=f"choose one of: {choices(src.is_image)}")
    src.state()  # a damaged or foreign checkpoint fails here, before any folder exists
    out = Path(out) if out else src.run.root / "exports" / f"{to}-{src.label}"
    notes: list[str] = []
    with output_dir(out) as tmp:
        if src.is_image:
            notes = _image(src, to, tmp, base)
        else:
            notes = _llm(src, to, tmp, base, adapter_mode, outtype)
        files = sorted(str(p.relative_to(tmp)) for p in tmp.rglob("*") if p.is_file())
    if picked is not None:
        notes.insert(0, picked.note(src.is_image))
    if record:
        src.run.event(f"export {to} of {src.label} -> {out}")
    return Exported(out, files, notes)


def _image_trainer(run: str | Path) -> str | None:
    """The external trainer that made an image run (its ``trainer.json``); None for lorapod's own
    engine and for axolotl's LLM runs, whose adapter is PEFT's and exports as lorapod's does."""
    from lorapod.rundir import RunDir
    from lorapod.spec import load_spec

    if not (Path(run) / "spec.yaml").is_file():
        return None  # not a run folder: open_source says why
    folder = RunDir.open(run)
    trainer = folder.recorded_trainer()
    if trainer is None or not load_spec(folder.spec_file).is_image:
        return None
    return trainer


def _trainer_run(root: Path, trainer: str, to: str, checkpoint: int | None, out: Path | None) -> Exported:
    """An image run trained by sd-scripts, ai-toolkit or musubi-tuner: its LoRA files are the
    trainer's own, already in the kohya layout ComfyUI loads (the mirror put the final one in
    ``adapter/``, each saved one in ``checkpoints/step-N/``). ``--to comfyui`` copies the file meant
    for ComfyUI (a converting family's ``NAME-comfyui.safetensors``, which musubi-tuner writes for
    Z-Image's final LoRA), once ``lorapod inspect``'s ComfyUI rule loads every module of it."""
    from lorapod.export.inspect import inspect_file
    from lorapod.rundir import RunDir
    from lorapod.rundir.layout import CHECKPOINT_GLOB, checkpoint_name
    from lorapod.trainers import get as get_trainer

    if to != "comfyui":
        raise ExportError(f"{root} was trained by {trainer}: its LoRA is the trainer's own kohya-layout file, "
                          f"which lorapod exports --to comfyui (not --to {to})",
                          hint="lorapod export RUN --to comfyui; then, for SD 1.5 / SDXL / FLUX, "
                               "`lorapod export FILE --to diffusers --family F` converts that file")
    run = RunDir.open(root)
    folder = run.adapter if checkpoint is None else run.checkpoints / checkpoint_name(checkpoint)
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        have = sorted(p.name for p in run.checkpoints.glob(CHECKPOINT_GLOB) if any(p.glob("*.safetensors")))
        raise ExportError(f"{root} has no {'final LoRA' if checkpoint is None else folder.name} from {trainer}",
                          hint=f"checkpoints with a LoRA there: {', '.join(have) or 'none'}"
                          + ("" if checkpoint is not None else " (export one with --checkpoint N)"))
    comfy = [f for f in files if f.name.endswith("-comfyui.safetensors")] or files
    notes = []
    for f in comfy:
        report = inspect_file(f)
        loads = report["consumers"].get("ComfyUI", {})
        if report["format"] != "kohya" or loads.get("drops") or not loads.get("loads"):
            drops = loads.get("drops") or []
            raise ExportError(f"ComfyUI would not load {f.name} whole ({report['format']} layout, "
                              f"{len(drops)} module(s) not in its model, e.g. {drops[:2]})",
                              hint=get_trainer(trainer).comfyui_hint(str(report["family"]))
                              or "lorapod inspect FILE says which modules")
        notes.append(f"{f.name}: {report['family']}, rank {report['rank']}; ComfyUI loads all "
                     f"{loads['loads']} module(s) (LoraLoader, strength 1.0)")
    label = "final" if checkpoint is None else checkpoint_name(checkpoint)
    out = Path(out) if out else root / "exports" / f"{to}-{label}"
    with output_dir(out) as tmp:
        for f in comfy:
            shutil.copyfile(f, tmp / f.name)
    run.event(f"export {to} of {label} ({trainer}) -> {out}")
    return Exported(out, sorted(f.name for f in comfy), notes)


def _image(src: Source, to: str, tmp: Path, base: str | None) -> list[str]:
    from lorapod.export import image

    if to == "comfyui":
        path = image.write_comfyui(src, tmp)
        return [f"{path.name}: load it in ComfyUI (LoraLoader), Forge or A1111 at strength 1.0"]
    if to == "diffusers":
        image.write_diffusers(src, tmp)
        return ["pipe.load_lora_weights(folder) loads it (diffusers, PEFT keys); not for ComfyUI (no .alpha)"]
    check = image.merge_pipeline(src, tmp, base)
    return [f"merged == base + adapter: max relative difference {check['max_diff']:.1e} "
            f"(tolerance {check['tolerance']:.0e})"]


def _llm(src: Source, to: str, tmp: Path, base: str | None, adapter_mode: bool, outtype: str) -> list[str]:
    from lorapod.export import gguf
    from lorapod.export.peft import write_peft

    spec = src.spec
    model_id = base or str(spec.model.id)
    state = src.state()
    name = spec.output.name or "lora"
    if to == "peft":
        write_peft(spec, state, tmp, model_id)
        return [f"PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained({model_id!r}), folder)"]
    if to == "gguf":
        config = _config(model_id, spec.model.revision)
        path = gguf.write_adapter(state, config, spec.method.alpha, spec.method.rslora, tmp / f"{name}.gguf", name)
        n = verify_adapter_gguf(path, gguf.adapter_tensors(state, config))
        return [f"{path.name}: llama.cpp LoRA adapter, {n} tensors read back equal",
                f"llama-cli -m BASE.gguf --lora {path.name}"]
    with tempfile.TemporaryDirectory() as work:
        peft_dir = write_peft(spec, state, Path(work) / "peft", model_id)
        if to == "merged":
            rep = _merge(model_id, peft_dir, tmp, spec.model.revision)
            return [f"merged in {rep.dtype}: max relative difference to base + adapter {rep.max_diff:.1e} "
                    f"(tolerance {rep.tolerance:.0e}); the adapter changes the logits by {rep.adapter_effect:.1e}"]
        return _ollama(src, model_id, peft_dir, Path(work), tmp, adapter_mode, outtype, state)


def _merge(model_id: str, peft_dir: Path, out: Path, revision: str | None):
    from lorapod.export.merge import merge

    return merge(model_id, peft_dir, out, revision)


def _config(model_id: str, revision: str | None):
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(model_id, revision=revision)
    except (OSError, ValueError) as exc:
        raise ExportError(f"could not read the base model's config {model_id}: {exc}",
                          hint="pass the base with --base PATH") from exc


def _ollama(src: Source, model_id: str, peft_dir: Path, work: Path, tmp: Path, adapter_mode: bool,
            outtype: str, state) -> list[str]:
    from transformers import AutoTokenizer

    from lorapod.export import gguf, ollama

    spec = src.spec
    name = spec.output.name or "lora"
    template = AutoTokenizer.from_pretrained(model_id, revision=spec.model.revision).chat_template
    notes = []
    if adapter_mode:
        _save_base(model_id, spec.model.revision, work / "base")
        gguf.write_model(work / "base", tmp / "base.gguf", outtype)
        gguf.write_adapter(state, _config(model_id, spec.model.revision), spec.method.alpha, spec.method.rslora,
                           tmp / "adapter.gguf", name)
        text = ollama.modelfile("base.gguf", "adapter.gguf", template)
        notes.append(ollama.ADAPTER_WARNING)
    else:
        rep = _merge(model_id, peft_dir, work / "merged", spec.model.revision)
        gguf.write_model(work / "merged", tmp / "model.gguf", outtype)
        text = ollama.modelfile("model.gguf", None, template)
        notes.append(f"merged in {rep.dtype} (max relative difference {rep.max_diff:.1e}), written as {outtype} GGUF")
    (tmp / "Modelfile").write_text(text, encoding="utf-8")
    cmds = ollama.commands(name)
    (tmp / "README.txt").write_text("In this folder:\n" + "\n".join(f"  {c}" for c in cmds) + "\n", encoding="utf-8")
    return [*notes, *cmds]


def _save_base(model_id: str, revision: str | None, out: Path) -> None:
    """The base as a local safetensors folder (GGUF is written from one)."""
    from transformers import AutoTokenizer

    from lorapod.export.merge import load_base

    load_base(model_id, revision).save_pretrained(str(out))
    AutoTokenizer.from_pretrained(model_id, revision=revision).save_pretrained(str(out))


def verify_adapter_gguf(path: Path, want: dict) -> int:
    """Read the file back: the same tensor names, shapes and values, and the adapter metadata."""
    from lorapod.export import gguf

    kv, got = gguf.read(path)
    if kv.get("general.type") != "adapter" or kv.get("adapter.type") != "lora":
        raise ExportError(f"{path}: written without the adapter metadata llama.cpp needs")
    if set(got) != set(want):
        raise ExportError(f"{path}: tensors differ from the adapter's after reading back")
    for k, t in want.items():
        if not np.allclose(got[k], t.numpy(), atol=1e-6):
            raise ExportError(f"{path}: tensor {k} reads back different")
    return len(got)
