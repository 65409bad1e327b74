"""kohya-ss/sd-scripts: SD 1.5, SDXL and FLUX.1 LoRAs the guide's way.

``accelerate launch sdxl_train_network.py`` (or ``train_network.py`` / ``flux_train_network.py``)
with a dataset TOML (buckets, repeats), networks.lora, U-Net only with cached text-encoder
outputs, AdamW8bit, constant_with_warmup, latents cached to disk, gradient checkpointing, SDPA,
bf16, sample prompts and saves every N epochs with ``--save_state`` so a stop can be resumed.
Output naming (recorded in the contract, library/train_util.py): ``NAME.safetensors``,
``NAME-000002.safetensors`` per epoch, ``NAME-step00000500.safetensors`` per step, and
``-state`` folders beside them; samples in ``<output_dir>/sample/``.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any, ClassVar

from lorapod.errors import SpecError
from lorapod.rundir.layout import checkpoint_step
from lorapod.trainers import tomlw
from lorapod.trainers.base import Artifact, Layout, Trainer, precision, prompts_of, safe_name
from lorapod.trainers.bridge import KohyaProgress
from lorapod.trainers.import_result import SCHEDULERS, ImportResult
from lorapod.trainers.job import Command, TrainerJob, TrainerRefused
from lorapod.trainers.tracking import run_name

SCRIPTS = {"sd15": "train_network.py", "sdxl": "sdxl_train_network.py", "flux1": "flux_train_network.py"}
OPTIMIZERS = {"adamw": "AdamW", "adamw_8bit": "AdamW8bit"}
# sdxl_train_network.py / flux_train_network.py assert_extra_args, word for word (English half)
TE_CACHE_REFUSAL = ("when caching Text Encoder output, either caption_dropout_rate, shuffle_caption, token_warmup_step "
                    "or caption_tag_dropout_rate cannot be used")
VIDEO_EXTS = (".mp4", ".webm", ".mov", ".mkv", ".avi", ".gif")
# FLUX.1 as sd-scripts reads it: separate files for the transformer, the autoencoder and both text
# encoders (flux_train_network.py --clip_l --t5xxl --ae).
FLUX_TEXT_ENCODERS = ("comfyanonymous/flux_text_encoders", "clip_l.safetensors", "t5xxl_fp16.safetensors")


def kohya_tracker_args(spec, layout: Layout, files: dict[str, str]) -> list[str]:
    """The spec's trackers as sd-scripts / musubi-tuner options (and the tracker TOML, added to ``files``).

    ``--log_with`` (tensorboard | wandb | all), ``--log_tracker_name`` as the W&B project and
    ``--log_tracker_config`` for the rest: their ``init_trackers`` (sd-scripts
    library/train_util.py:6589, musubi-tuner hv_train_network.py) pass the TOML's ``[wandb]`` table
    to accelerate's ``WandBTracker``, whose ``wandb.init(project=..., **kwargs)`` takes ``entity``,
    ``name`` and ``mode``; the file *replaces* ``--wandb_run_name``, so the name goes in it too.
    accelerate's ``all`` is every tracker it finds installed (tensorboard and wandb here)."""
    t = spec.tracking
    w = t.wandb
    if w is None:
        return ["--log_with", "tensorboard"] if t.tensorboard else []
    args = ["--log_with", "all" if t.tensorboard else "wandb", "--log_tracker_name", w.project]
    table = {"name": run_name(spec)}
    if w.entity:
        table["entity"] = w.entity
    if w.mode:
        table["mode"] = w.mode
    path = f"{layout.job}/trackers.toml"
    files[path] = tomlw.dumps({"wandb": table})
    return [*args, "--log_tracker_config", path]

def video_files(spec) -> list[Path]:
    """Video files at the top of the data folders: sd-scripts (library/train_util.py glob_images) and
    musubi-tuner (dataset/media_utils.py glob_images/glob_videos) read no subfolders."""
    out: list[Path] = []
    for p in spec.data_paths():
        if p.is_dir():
            out += sorted(f for f in p.iterdir() if f.is_file() and f.suffix.lower() in VIDEO_EXTS)
    return out


def hf_download(layout: Layout, repo: str, filename: str) -> Command:
    """Fetch one file of a hub repo into the job's models folder (HF_TOKEN from secrets.env)."""
    code = ("import sys; from huggingface_hub import hf_hub_download as d; "
            "print(d(sys.argv[1], sys.argv[2], local_dir=sys.argv[3]))")
    return Command(f"download {repo}/{filename}", [layout.python, "-c", code, repo, filename, layout.models], "prepare")


class KohyaOutputs:
    """The output naming sd-scripts and musubi-tuner share (NAME-000002, NAME-step00000500, -state)."""

    resume_kind = "state"

    def metrics_parser(self, job: TrainerJob) -> KohyaProgress:
        return KohyaProgress(offset=job.step_offset, total_offset=job.total_offset)

    def artifacts(self, layout: Layout, name: str) -> list[Artifact]:
        out = Path(layout.out)
        if not out.is_dir():
            return []
        found: list[Artifact] = []
        n = re.escape(name)
        pats = [(re.compile(rf"^{n}-(\d{{6}})(-state)?$"), "epoch"), (re.compile(rf"^{n}-step(\d{{8}})(-state)?$"), "step")]
        for p in sorted(out.iterdir()):
            stem = p.name[: -len(".safetensors")] if p.name.endswith(".safetensors") else p.name
            if p.is_file() and p.name == f"{name}.safetensors":
                found.append(Artifact("final", p.name, p))
                continue
            if p.is_dir() and p.name == f"{name}-state":
                found.append(Artifact("state", "last", p))
                continue
            for pat, unit in pats:
                m = pat.match(stem)
                if m and (p.is_dir() == bool(m.group(2))):
                    found.append(Artifact("state" if m.group(2) else "checkpoint", f"{unit}-{int(m.group(1))}", p))
        sample = out / "sample"
        if sample.is_dir():
            found += [Artifact("sample", f.name, f) for f in sorted(sample.iterdir()) if f.is_file()]
        return found

    def resume(self, job: TrainerJob, checkpoint: Path) -> None:
        state = checkpoint / "state"
        if not state.is_dir():
            raise TrainerRefused(f"{checkpoint} holds no trainer state to resume from",
                                 hint="it was saved without --save_state; start a new run")
        job.train_command().argv += ["--resume", str(state)]
        job.step_offset = resumed_step(checkpoint)


def resumed_step(checkpoint: Path) -> int:
    """The optimizer step a kohya state was saved at: its ``train_state.json`` ``current_step``
    (sd-scripts saves one with every state), else the checkpoint's key (``step-N``; musubi-tuner's
    states hold no train_state.json, tests/recorded/wan), else, for the final state (``last``), the
    run's step the runner wrote beside it when the trainer ended (runner.FINAL_STATE_STEP)."""
    import json

    from lorapod.trainers.runner import FINAL_STATE_STEP

    try:
        return int(json.loads((checkpoint / "state" / "train_state.json").read_text())["current_step"])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    step = checkpoint_step(checkpoint.name)
    if step is not None:
        return step
    try:
        return int(json.loads((checkpoint / FINAL_STATE_STEP).read_text())["step"])
    except (OSError, ValueError, KeyError, TypeError):
        return 0


class SdScripts(KohyaOutputs, Trainer):
    name = "sd-scripts"
    title = "kohya sd-scripts"
    families = ("sd15", "sdxl", "flux1")
    contract = "kohya_sd_scripts.json"
    repo = "https://github.com/kohya-ss/sd-scripts.git"
    commit = "48d368fa557731ad0488c07304dfeba8c07910eb"
    install = ("-r", "requirements.txt")
    torch = "torch>=2.4"
    refusals: ClassVar[dict[str, str]] = {
        TE_CACHE_REFUSAL: "--set data.cache_text_encoder_outputs=false, or data.shuffle_captions=false and "
                          "data.caption_dropout=0, then `lorapod run --resume JOB`"}

    # ---------------------------------------------------------------- lorapod import

    config_kind = "an sd-scripts dataset TOML (.toml, with --flags)"

    @classmethod
    def reads_config(cls, path: Path, cfg: Any) -> bool:
        return path.suffix == ".toml"

    def import_config(self, cfg: Any, flags: str = "") -> ImportResult:
        return from_sd_scripts(cfg, flags)

    def resume(self, job: TrainerJob, checkpoint: Path) -> None:
        """``--resume STATE --skip_until_initial_step``: without the skip, train_network.py skips
        only whole epochs (``initial_step = 0  # do not skip``) and trains the resumed epoch's
        first steps again. Either way it numbers its steps from 0 again (``global_step =
        initial_step`` after the skipped epochs were subtracted), and its bar runs to
        ``max_train_steps`` (tests/recorded/sd15/resume.log): lorapod adds the state's step."""
        super().resume(job, checkpoint)
        job.train_command().argv.append("--skip_until_initial_step")

    def refuse(self, spec) -> list[str]:
        r = super().refuse(spec)
        if r:
            return r
        m, d, t = spec.method, spec.data, spec.train
        if m.type == "qlora":
            r.append("sd-scripts has no 4-bit base: use method.type lora (model.dtype fp8 halves the base instead)")
        if m.target_modules != "all-linear":
            r.append("sd-scripts picks LoRA targets by module type (networks.lora), not by name: "
                     "method.target_modules must be all-linear")
        if m.rslora:
            r.append("networks.lora has no rank-stabilised scaling: method.rslora must be false")
        if m.train_text_encoder and d.cache_text_encoder_outputs:
            r.append("cached text-encoder outputs need U-Net-only training: set method.train_text_encoder false "
                     "or data.cache_text_encoder_outputs false")
        if d.cache_text_encoder_outputs and spec.model.family == "sd15":
            # train_network.py's parser has no --cache_text_encoder_outputs (only the SDXL/FLUX scripts')
            r.append("train_network.py (SD 1.5) cannot cache text-encoder outputs: "
                     "--set data.cache_text_encoder_outputs=false")
        elif d.cache_text_encoder_outputs and (d.shuffle_captions or d.caption_dropout):
            # SdxlNetworkTrainer / FluxNetworkTrainer.assert_extra_args, after the instance is set up
            r.append(f"{SCRIPTS[spec.model.family]} says: \"{TE_CACHE_REFUSAL}\": "
                     "--set data.cache_text_encoder_outputs=false, or data.shuffle_captions=false and "
                     "data.caption_dropout=0")
        if spec.model.family != "flux1" and t.timestep_sampling != "uniform":
            r.append(f"{SCRIPTS[spec.model.family]} samples timesteps uniformly: train.timestep_sampling must be uniform")
        if spec.model.family != "flux1" and t.blocks_to_swap:
            r.append(f"{SCRIPTS[spec.model.family]} has no block swap: train.blocks_to_swap must be 0")
        videos = video_files(spec)
        if videos:
            r.append(f"sd-scripts trains on images; the data has {len(videos)} video file(s) such as "
                     f"{videos[0].name}: use --trainer musubi-tuner, or remove them")
        if isinstance(spec.samples.prompts, str) and not Path(spec.samples.prompts).is_file():
            r.append(f"samples.prompts {spec.samples.prompts!r} is not a file here: give a list of prompts or a file")
        return r

    def build(self, spec, layout: Layout, *, images: int | None = None) -> TrainerJob:
        fam = spec.model.family
        name = safe_name(spec)
        d, t, m, s = spec.data, spec.train, spec.method, spec.save
        notes: list[str] = []
        general: dict = {"caption_extension": d.caption_extension, "shuffle_caption": d.shuffle_captions}
        if d.trigger and d.shuffle_captions:
            general["keep_tokens"] = 1  # the trigger word stays first when captions are shuffled
        if d.flip:
            general["flip_aug"] = True
        if d.caption_dropout:
            general["caption_dropout_rate"] = float(d.caption_dropout)
        dataset = {"resolution": d.resolution, "batch_size": t.micro_batch_size, "enable_bucket": d.buckets,
                   "subsets": [{"image_dir": str(p), "num_repeats": d.repeats} for p in spec.data_paths()]}
        if d.buckets:
            dataset["bucket_no_upscale"] = True
            dataset.update(bucket_bounds(d.resolution))
        files = {f"{layout.job}/dataset.toml": tomlw.dumps({"general": general, "datasets": [dataset]})}

        prec = precision(spec)
        script = SCRIPTS[fam]
        prepare: list[Command] = []
        model = spec.model.id
        a = ["--pretrained_model_name_or_path", model]
        if fam == "flux1":
            variant = spec.model.variant or "dev"
            if not model.endswith(".safetensors"):
                prepare += [hf_download(layout, model, f"flux1-{variant}.safetensors"),
                            hf_download(layout, model, "ae.safetensors")]
                a = ["--pretrained_model_name_or_path", f"{layout.models}/flux1-{variant}.safetensors",
                     "--ae", f"{layout.models}/ae.safetensors"]
            else:
                prepare.append(hf_download(layout, "black-forest-labs/FLUX.1-schnell", "ae.safetensors"))
                a += ["--ae", f"{layout.models}/ae.safetensors"]
            repo, clip, t5 = FLUX_TEXT_ENCODERS
            prepare += [hf_download(layout, repo, clip), hf_download(layout, repo, t5)]
            a += ["--clip_l", f"{layout.models}/{clip}", "--t5xxl", f"{layout.models}/{t5}"]
        a += ["--dataset_config", f"{layout.job}/dataset.toml", "--output_dir", layout.out, "--output_name", name,
              "--save_model_as", "safetensors",
              "--network_module", "networks.lora_flux" if fam == "flux1" else "networks.lora",
              "--network_dim", str(m.r), "--network_alpha", _num(m.alpha)]
        if m.dropout:
            a += ["--network_dropout", _num(m.dropout)]
        if not m.train_text_encoder:
            a.append("--network_train_unet_only")
        if d.cache_text_encoder_outputs:
            a += ["--cache_text_encoder_outputs", "--cache_text_encoder_outputs_to_disk"]
        if d.cache_latents:
            a += ["--cache_latents", "--cache_latents_to_disk"]
        a += ["--optimizer_type", OPTIMIZERS[t.optimizer], "--learning_rate", _num(t.learning_rate),
              "--lr_scheduler", t.scheduler]
        if t.warmup_steps:
            a += ["--lr_warmup_steps", str(t.warmup_steps)]
        elif t.warmup_ratio:
            a += ["--lr_warmup_steps", _num(t.warmup_ratio)]  # a float is a ratio of the total steps
        if t.weight_decay:
            a += ["--optimizer_args", f"weight_decay={_num(t.weight_decay)}"]
        a += ["--max_train_steps", str(t.max_steps)] if t.max_steps else ["--max_train_epochs", str(t.epochs)]
        if t.grad_accum > 1:
            a += ["--gradient_accumulation_steps", str(t.grad_accum)]
        a += ["--max_grad_norm", _num(t.max_grad_norm or 0.0)]  # 0 turns clipping off
        if t.gradient_checkpointing:
            a.append("--gradient_checkpointing")
        a += ["--sdpa", "--mixed_precision", "no" if prec == "fp32" else prec,
              "--save_precision", "float" if prec == "fp32" else prec, "--seed", str(t.seed)]
        if spec.model.dtype == "fp8":
            a.append("--fp8_base")
        if t.noise_offset:
            a += ["--noise_offset", _num(t.noise_offset)]
        if t.min_snr_gamma:
            a += ["--min_snr_gamma", _num(t.min_snr_gamma)]
        if fam == "flux1":
            sampling = {"uniform": "uniform", "logit_normal": "sigmoid", "shift": "shift"}[t.timestep_sampling]
            a += ["--timestep_sampling", sampling, "--model_prediction_type", "raw", "--guidance_scale", "1.0"]
            if sampling == "shift":
                a += ["--discrete_flow_shift", _num(t.timestep_shift)]
            if t.blocks_to_swap:
                a += ["--blocks_to_swap", str(t.blocks_to_swap)]
        if s.every_steps:
            last = str(last_n_steps(s.keep_last, s.every_steps))
            a += ["--save_every_n_steps", str(s.every_steps), "--save_last_n_steps", last,
                  "--save_last_n_steps_state", last]
        if s.every_epochs:
            a += ["--save_every_n_epochs", str(s.every_epochs), "--save_last_n_epochs", str(s.keep_last),
                  "--save_last_n_epochs_state", str(s.keep_last)]
        a += ["--save_state", "--logging_dir", layout.logs, *kohya_tracker_args(spec, layout, files),
              "--max_data_loader_n_workers", "2", "--persistent_data_loader_workers"]
        prompts = prompts_of(spec)
        if prompts:
            files[f"{layout.job}/prompts.txt"] = "\n".join(prompts) + "\n"
            a += ["--sample_prompts", f"{layout.job}/prompts.txt"]
            if spec.samples.every_steps:
                a += ["--sample_every_n_steps", str(spec.samples.every_steps)]
            if spec.samples.every_epochs:
                a += ["--sample_every_n_epochs", str(spec.samples.every_epochs)]
        if spec.eval.every_steps or d.val_path:
            notes.append("eval.* and data.val_path have no effect: sd-scripts validates only with a validation_split")
        if m.train_text_encoder:
            notes.append("the text encoder trains at train.learning_rate (sd-scripts --text_encoder_lr not set)")
        accel = [layout.python, "-m", "accelerate.commands.launch", "--num_cpu_threads_per_process", "1",
                 "--mixed_precision", "no" if prec == "fp32" else prec]
        train = Command("train", [*accel, f"{layout.src}/{script}", *a], "train", cwd=layout.src, script=script)
        return TrainerJob(self.name, files, self.setup_commands(layout, layout.python), [*prepare, train],
                          layout.out, name, notes)


# sd-scripts' dataset defaults (library/config_util.py DreamBoothDatasetParams)
MIN_BUCKET_RESO, MAX_BUCKET_RESO, BUCKET_RESO_STEPS = 256, 1024, 64


def bucket_bounds(resolution: int) -> dict[str, int]:
    """``min_bucket_reso`` / ``max_bucket_reso`` for a resolution outside sd-scripts' defaults
    (256..1024). With buckets on, every dataset asserts ``min(resolution) >= min_bucket_reso`` and
    ``max(resolution) <= max_bucket_reso`` after rounding min down and max up to a multiple of
    ``bucket_reso_steps`` (library/train_util.py adjust_min_max_bucket_reso_by_steps), even with
    bucket_no_upscale: data.resolution 128 stopped at start-up with "min_bucket_reso must be equal
    or less than resolution". The bound is the resolution itself, on the 64 grid."""
    out: dict[str, int] = {}
    if resolution < MIN_BUCKET_RESO:
        out["min_bucket_reso"] = max(BUCKET_RESO_STEPS, resolution - resolution % BUCKET_RESO_STEPS)
    if resolution > MAX_BUCKET_RESO:
        out["max_bucket_reso"] = resolution + (-resolution % BUCKET_RESO_STEPS)
    return out


def last_n_steps(keep_last: int, every_steps: int) -> int:
    """``--save_last_n_steps`` that keeps ``keep_last`` step saves. At each save both kohya trainers
    remove step ``step - save_last_n_steps - 1`` rounded down to a multiple of save_every_n_steps
    (sd-scripts library/train_util.py get_remove_step_no and save_and_remove_state_stepwise,
    musubi-tuner utils/train_utils.py the same), so N steps keep N/every + 1 saves."""
    return (keep_last - 1) * every_steps


def _num(x: float) -> str:
    """Numbers as the trainers' parsers read them: 1e-4 not 0.0001, 16 not 16.0."""
    if float(x).is_integer() and abs(x) >= 1:
        return str(int(x))
    return f"{x:g}"


# ------------------------------------------------------------------ lorapod import (dataset TOML + flags -> spec)

_KOHYA_FAMILY = {script: fam for fam, script in SCRIPTS.items()}
_KOHYA_OPTIMIZERS = {theirs.lower(): mine for mine, theirs in OPTIMIZERS.items()}  # its parser's names, any case
_KOHYA_TAKEN = {"output_dir", "save_model_as", "network_module", "sdpa", "xformers", "save_precision", "save_state",
                "logging_dir", "log_with", "max_data_loader_n_workers", "persistent_data_loader_workers",
                "dataset_config", "cache_latents_to_disk", "cache_text_encoder_outputs_to_disk",
                "model_prediction_type", "guidance_scale", "save_last_n_epochs_state", "save_last_n_steps_state",
                "save_last_n_steps", "clip_l", "t5xxl", "ae", "num_cpu_threads_per_process"}
_KOHYA_DIRECT = {"pretrained_model_name_or_path": ("model.id", str), "network_dim": ("method.r", int),
                 "network_alpha": ("method.alpha", float), "network_dropout": ("method.dropout", float),
                 "learning_rate": ("train.learning_rate", float), "max_train_epochs": ("train.epochs", int),
                 "max_train_steps": ("train.max_steps", int), "gradient_accumulation_steps": ("train.grad_accum", int),
                 "seed": ("train.seed", int), "noise_offset": ("train.noise_offset", float),
                 "min_snr_gamma": ("train.min_snr_gamma", float), "discrete_flow_shift": ("train.timestep_shift", float),
                 "blocks_to_swap": ("train.blocks_to_swap", int), "save_every_n_epochs": ("save.every_epochs", int),
                 "save_every_n_steps": ("save.every_steps", int), "save_last_n_epochs": ("save.keep_last", int),
                 "sample_prompts": ("samples.prompts", str), "sample_every_n_epochs": ("samples.every_epochs", int),
                 "sample_every_n_steps": ("samples.every_steps", int), "output_name": ("output.name", str),
                 "train_batch_size": ("train.micro_batch_size", int)}
_KOHYA_FLAGS_ON = {"gradient_checkpointing": "train.gradient_checkpointing",
                   "cache_latents": "data.cache_latents", "cache_text_encoder_outputs": "data.cache_text_encoder_outputs"}


def _parse_flags(flags: str) -> tuple[str | None, list[tuple[str, list[str]]]]:
    """(the script named in the command, [(option, values)]) from a command line or bare options."""
    words = shlex.split(flags)
    script = next((w.rsplit("/", 1)[-1] for w in words if w.endswith(".py")), None)
    if script is not None:
        words = words[next(i for i, w in enumerate(words) if w.endswith(".py")) + 1:]
    opts: list[tuple[str, list[str]]] = []
    for w in words:
        if w.startswith("--"):
            name, eq, val = w[2:].partition("=")
            opts.append((name, [val] if eq else []))
        elif opts:
            opts[-1][1].append(w)
    return script, opts


def from_sd_scripts(toml: dict[str, Any], flags: str) -> ImportResult:
    from lorapod.trainers.contracts import script_options

    r = ImportResult("sd-scripts")
    r.put("data.format", "images")
    _kohya_dataset(r, toml)
    script, opts = _parse_flags(flags)
    if script in _KOHYA_FAMILY:
        r.put("model.family", _KOHYA_FAMILY[script])
    elif script is not None:
        r.skip(script, "lorapod imports train_network.py, sdxl_train_network.py and flux_train_network.py")
    known = {o.lstrip("-") for o in script_options("kohya_sd_scripts.json", script if script in _KOHYA_FAMILY
                                                   else "sdxl_train_network.py")}
    r.put("method.train_text_encoder", True)
    r.put("data.cache_latents", False)
    r.put("data.cache_text_encoder_outputs", False)
    r.put("train.max_grad_norm", 1.0)
    r.put("method.dropout", 0.0)  # sd-scripts' networks.lora has no dropout unless --network_dropout
    for name, vals in opts:
        v = vals[0] if vals else None
        if name not in known:
            hint = " (the SDXL docs' --text_encoder_lr1/2; the parser takes --text_encoder_lr LR1 LR2)" \
                if name.startswith("text_encoder_lr") else ""
            r.skip(f"--{name}", f"not an option of the pinned sd-scripts{hint}")
        elif name in _KOHYA_TAKEN:
            continue
        elif name in _KOHYA_DIRECT:
            dotted, typ = _KOHYA_DIRECT[name]
            r.put(dotted, typ(v))
        elif name in _KOHYA_FLAGS_ON:
            r.put(_KOHYA_FLAGS_ON[name], True)
        elif name == "network_train_unet_only":
            r.put("method.train_text_encoder", False)
        elif name == "optimizer_type":
            low = (v or "").lower()
            if low in _KOHYA_OPTIMIZERS:
                r.put("train.optimizer", _KOHYA_OPTIMIZERS[low])
            else:
                r.skip("--optimizer_type", f"optimizer {v!r}: lorapod has AdamW and AdamW8bit")
        elif name == "optimizer_args" and all(a.startswith("weight_decay=") for a in vals):
            r.put("train.weight_decay", float(vals[0].split("=", 1)[1]))
        elif name == "lr_scheduler":
            if v in SCHEDULERS:
                r.put("train.scheduler", v)
            else:
                r.skip("--lr_scheduler", f"scheduler {v!r}")
        elif name == "lr_warmup_steps":
            x = float(v)
            r.put("train.warmup_ratio" if x < 1 else "train.warmup_steps", x if x < 1 else int(x))
        elif name == "max_grad_norm":
            r.put("train.max_grad_norm", float(v) or None)
        elif name == "mixed_precision":
            r.put("train.precision", {"no": "fp32"}.get(v, v))
        elif name == "fp8_base":
            r.put("model.dtype", "fp8")
        elif name == "timestep_sampling":
            mapped = {"uniform": "uniform", "sigmoid": "logit_normal", "shift": "shift"}.get(v)
            if mapped:
                r.put("train.timestep_sampling", mapped)
            else:
                r.skip("--timestep_sampling", f"{v!r}")
        else:
            r.skip(f"--{name}")
    return r


def _kohya_dataset(r: ImportResult, toml: dict[str, Any]) -> None:
    general = toml.get("general", {})
    datasets = toml.get("datasets", [])
    subsets = [(ds, sub) for ds in datasets for sub in ds.get("subsets", [])]
    if not subsets:
        raise SpecError("the dataset TOML has no [[datasets.subsets]] with an image_dir",
                        hint="lorapod imports DreamBooth-style datasets (image_dir + captions)")
    paths = [str(sub.get("image_dir")) for _, sub in subsets]
    r.put("data.path", paths[0] if len(paths) == 1 else paths)
    merged: dict[str, Any] = {}
    for ds, sub in subsets[:1]:
        merged = {**general, **{k: v for k, v in ds.items() if k != "subsets"}, **sub}
    direct = {"num_repeats": "data.repeats", "batch_size": "train.micro_batch_size", "enable_bucket": "data.buckets",
              "caption_extension": "data.caption_extension", "shuffle_caption": "data.shuffle_captions",
              "flip_aug": "data.flip", "caption_dropout_rate": "data.caption_dropout"}
    for k, v in merged.items():
        if k in direct:
            r.put(direct[k], v)
        elif k == "resolution":
            res = v if isinstance(v, list) else [v, v]
            r.put("data.resolution", max(res))
            if res[0] != res[1]:
                r.skip("resolution", f"{res}: lorapod trains at one square size ({max(res)}) with buckets")
        elif k not in ("image_dir", "keep_tokens", "bucket_no_upscale"):
            r.skip(f"dataset.{k}")
    if len({sub.get("num_repeats", 1) for _, sub in subsets}) > 1:
        r.skip("subsets[].num_repeats", "different repeats per folder: lorapod has one data.repeats")
