"""ostris/ai-toolkit: FLUX.1 and FLUX.2 [klein] LoRAs (and SDXL / SD 1.5) with ``python run.py CONFIG``.

One job YAML (``job: extension``, one ``sd_trainer`` process) with the ``model`` (``arch``),
``network``, ``datasets``, ``train``, ``save``, ``sample`` and ``logging`` blocks. ai-toolkit
counts steps, not epochs, so epochs become ``train.steps`` from the image count. The 24 GB profile
(quantize the transformer and the text encoder to fp8, ``low_vram``) is used for an fp8 base, for
FLUX.1 (12B parameters) and for a pinned GPU of 24 GB or less. ``logging.use_ui_logger`` makes
it write ``loss_log.db``, which lorapod reads for metrics. Outputs (recorded in the contract):
``<training_folder>/<name>/<name>_<step:09d>.safetensors``, final ``<name>.safetensors``,
``optimizer.pt``, samples in ``samples/``.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from lorapod.rundir.layout import checkpoint_name
from lorapod.trainers.base import (
    Artifact,
    Layout,
    Trainer,
    image_count,
    precision,
    prompts_of,
    safe_name,
    total_steps,
)
from lorapod.trainers.bridge import AiToolkitSqlite
from lorapod.trainers.import_result import SCHEDULERS, ImportResult
from lorapod.trainers.job import Command, TrainerJob, TrainerRefused, dump_yaml

ARCH = {"flux1": "flux", "sdxl": "sdxl", "sd15": "sd1"}
KLEIN = {"4b": "flux2_klein_4b", "9b": "flux2_klein_9b"}
# The transformer file each klein arch downloads from the repo in name_or_path (ai-toolkit
# extensions_built_in/diffusion_models/flux2/flux2_klein_model.py ``flux2_te_filename``, loaded by
# flux2_model.py load_model with hf_hub_download): the undistilled base, which its UI pairs with the
# arch (ui/src/app/jobs/new/options.tsx: flux2_klein_4b -> black-forest-labs/FLUX.2-klein-base-4B).
KLEIN_FILE = {"4b": "flux-2-klein-base-4b.safetensors", "9b": "flux-2-klein-base-9b.safetensors"}
KLEIN_BASE_REPO = {"4b": "black-forest-labs/FLUX.2-klein-base-4B", "9b": "black-forest-labs/FLUX.2-klein-base-9B"}
# BFL's step-distilled klein repositories, which are not the base those archs load
KLEIN_DISTILLED = re.compile(r"black-forest-labs/FLUX\.2-klein-(4|9)B", re.I)
# What ai-toolkit's UI writes into a new klein job's sample block (ui/src/helpers/defaultSamples.ts
# defaultSampleConfig: guidance_scale 4, sample_steps 30; options.tsx's flux2_klein_* override neither).
# SampleConfig's own defaults (toolkit/config_modules.py: 7 and 20) are SD's; klein base is not
# guidance-distilled (flux2_klein_model.py flux2_is_guidance_distilled False), so it samples with CFG.
KLEIN_SAMPLE = {"guidance_scale": 4.0, "sample_steps": 30}
OPTIMIZERS = {"adamw": "adamw", "adamw_8bit": "adamw8bit"}
TIMESTEPS = {"uniform": "linear", "logit_normal": "sigmoid", "shift": "shift"}


class AiToolkit(Trainer):
    name = "ai-toolkit"
    title = "ostris ai-toolkit"
    families = ("flux1", "flux2", "sdxl", "sd15")
    contract = "ai_toolkit.json"
    repo = "https://github.com/ostris/ai-toolkit.git"
    commit = "27a03a91f23eb1b757d5ec2e80ee3e129cfcc350"
    install = ("-r", "requirements.txt")
    torch = "torch>=2.7"
    # ai-toolkit (toolkit/logging_aitk.py ``create_logger``) keeps one logger: with
    # ``logging.use_wandb`` it returns the WandbLogger *instead of* the UI logger, so loss_log.db,
    # which lorapod reads for the metrics, the stall watch and the dollars, would no longer be
    # written. Its logging is left as it is and the wrapper sends the bridged metrics to W&B itself,
    # under the engine's names.
    forwarded_trackers = ("wandb",)

    def refuse(self, spec) -> list[str]:
        r = super().refuse(spec)
        if r:
            return r
        m, t = spec.method, spec.train
        if m.type == "qlora":
            r.append("ai-toolkit quantizes the base itself: use method.type lora with model.dtype fp8")
        if m.target_modules != "all-linear" or m.rslora:
            r.append("ai-toolkit's LoRA network picks its own targets and has no rslora: "
                     "method.target_modules all-linear, method.rslora false")
        variant = (spec.model.variant or "").lower()
        if spec.model.family == "flux2" and variant not in KLEIN:
            r.append(f"ai-toolkit trains FLUX.2 [klein] here: model.variant must be one of {', '.join(KLEIN)}")
        elif spec.model.family == "flux2" and KLEIN_DISTILLED.fullmatch(spec.model.id):
            r.append(f"ai-toolkit's {KLEIN[variant]} loads {KLEIN_FILE[variant]} from the model.id repository "
                     f"(flux2_klein_model.py), the undistilled base; {spec.model.id} is the step-distilled model: "
                     f"--set model.id={KLEIN_BASE_REPO[variant]}")
        if t.blocks_to_swap:
            r.append("ai-toolkit offloads with model.low_vram, not a block count: train.blocks_to_swap must be 0")
        if isinstance(spec.samples.prompts, str) and not Path(spec.samples.prompts).is_file():
            r.append(f"samples.prompts {spec.samples.prompts!r} is not a file here: give a list of prompts")
        return r

    def build(self, spec, layout: Layout, *, images: int | None = None) -> TrainerJob:
        name = safe_name(spec)
        d, t, m, s = spec.data, spec.train, spec.method, spec.save
        fam = spec.model.family
        images = images or image_count(spec)
        steps = total_steps(spec, images)
        if steps is None:
            raise TrainerRefused("ai-toolkit counts steps, and the image count is unknown here",
                                 hint="put the images at data.path, or --set train.max_steps=N")
        gpu_small = False
        if spec.compute.gpu:
            from lorapod.catalog.gpus import find_gpu

            gpu_small = find_gpu(spec.compute.gpu).vram_gb <= 24
        quantize = spec.model.dtype == "fp8" or fam == "flux1" or gpu_small
        prec = precision(spec)
        dtype = {"bf16": "bf16", "fp16": "fp16", "fp32": "float32"}[prec]
        model: dict = {"name_or_path": spec.model.id,
                       "arch": KLEIN[(spec.model.variant or "").lower()] if fam == "flux2" else ARCH[fam]}
        if quantize:
            model.update({"quantize": True, "quantize_te": True, "qtype": "qfloat8", "qtype_te": "qfloat8"})
        if gpu_small or spec.model.dtype == "fp8":
            model["low_vram"] = True
        network: dict = {"type": "lora", "linear": m.r, "linear_alpha": float(m.alpha)}
        if m.dropout:
            network["dropout"] = float(m.dropout)
        datasets = []
        for p in spec.data_paths():
            ds: dict = {"folder_path": str(p), "caption_ext": d.caption_extension.lstrip("."),
                        "caption_dropout_rate": float(d.caption_dropout), "shuffle_tokens": d.shuffle_captions,
                        "cache_latents_to_disk": d.cache_latents, "resolution": [d.resolution],
                        "buckets": d.buckets, "num_repeats": d.repeats}
            if d.trigger and d.shuffle_captions:
                ds["keep_tokens"] = 1
            if d.flip:
                ds["flip_x"] = True
            datasets.append(ds)
        train: dict = {"batch_size": t.micro_batch_size, "steps": steps, "gradient_accumulation": t.grad_accum,
                       "train_unet": True, "train_text_encoder": m.train_text_encoder,
                       "gradient_checkpointing": t.gradient_checkpointing,
                       "noise_scheduler": "flowmatch" if fam in ("flux1", "flux2") else "ddpm",
                       "optimizer": OPTIMIZERS[t.optimizer], "lr": float(t.learning_rate), "dtype": dtype}
        if fam in ("flux1", "flux2"):
            train["timestep_type"] = TIMESTEPS[t.timestep_sampling]
        warmup = t.warmup_steps or round(t.warmup_ratio * steps)
        if t.scheduler == "cosine":
            train["lr_scheduler"] = "cosine"  # CosineAnnealingLR(T_max=steps): down to 0
        elif t.scheduler == "linear":
            # toolkit/scheduler.py builds torch's LinearLR(optimizer, **params) with total_iters=steps
            # (BaseSDTrainProcess): with torch's defaults (start 1/3, end 1) it warms up. A decay to 0,
            # as lorapod's (and sd-scripts', HF's) linear, needs the factors given.
            train["lr_scheduler"] = "linear"
            train["lr_scheduler_params"] = {"start_factor": 1.0, "end_factor": 0.0}
        elif t.scheduler == "constant_with_warmup":
            # toolkit/scheduler.py get_lr_scheduler: diffusers' constant schedule with warmup
            train["lr_scheduler"] = "constant_with_warmup"
            train["lr_scheduler_params"] = {"num_warmup_steps": warmup}
        if t.weight_decay:
            train["optimizer_params"] = {"weight_decay": float(t.weight_decay)}
        # TrainConfig's default is 1.0 (config_modules.py), and SDTrainer always calls
        # clip_grad_norm_(params, max_grad_norm): 0 would zero every gradient, infinity clips nothing
        train["max_grad_norm"] = float(t.max_grad_norm) if t.max_grad_norm else float("inf")
        if t.noise_offset:
            train["noise_offset"] = float(t.noise_offset)
        if t.min_snr_gamma:
            train["min_snr_gamma"] = float(t.min_snr_gamma)
        if d.cache_text_encoder_outputs and not m.train_text_encoder:
            train["cache_text_embeddings"] = True
        save_every = s.every_steps or _epoch_steps(spec, images, s.every_epochs) or steps
        save = {"dtype": dtype if dtype != "float32" else "float16", "save_every": save_every,
                "max_step_saves_to_keep": s.keep_last}
        proc: dict = {"type": "sd_trainer", "training_folder": layout.out}
        if d.trigger:
            proc["trigger_word"] = d.trigger
        proc.update({"network": network, "save": save, "datasets": datasets, "train": train, "model": model,
                     "logging": {"log_every": 1, "use_ui_logger": True}})
        prompts = prompts_of(spec)
        if prompts:
            every = spec.samples.every_steps or _epoch_steps(spec, images, spec.samples.every_epochs) or save_every
            proc["sample"] = {"sampler": "flowmatch" if fam in ("flux1", "flux2") else "ddpm", "sample_every": every,
                              "width": d.resolution, "height": d.resolution, "seed": t.seed, "walk_seed": True,
                              "samples": [{"prompt": p} for p in prompts]}
            if fam == "flux2":
                proc["sample"].update(KLEIN_SAMPLE)
        else:
            train["disable_sampling"] = True
        notes = []
        if warmup and t.scheduler != "constant_with_warmup":
            notes.append(f"train.warmup_* has no effect with {t.scheduler}: lorapod warms up ai-toolkit's "
                         "constant_with_warmup only")
        if spec.eval.every_steps or d.val_path:
            notes.append("eval.* and data.val_path have no effect: ai-toolkit does not validate")
        if fam in ("flux1", "flux2") and t.timestep_sampling == "shift":
            notes.append("train.timestep_shift has no effect: ai-toolkit's timestep_type shift uses the model "
                         "scheduler's own (resolution-dependent) shift")
        cfg = {"job": "extension", "config": {"name": name, "process": [proc]}, "meta": {"name": "[name]", "version": "1.0"}}
        path = f"{layout.job}/config.yaml"
        env_seed = ["env", f"SEED={t.seed}"]
        cmd = Command("train", [*env_seed, layout.python, "run.py", path], "train", cwd=layout.src)
        return TrainerJob(self.name, {path: dump_yaml(cfg)}, self.setup_commands(layout, layout.python), [cmd],
                          f"{layout.out}/{name}", name, notes, config=cfg)

    # ---------------------------------------------------------------- lorapod import

    config_kind = "an ai-toolkit job (job:, config:)"

    @classmethod
    def reads_config(cls, path: Path, cfg: Any) -> bool:
        return isinstance(cfg, dict) and "job" in cfg and "config" in cfg

    def import_config(self, cfg: Any, flags: str = "") -> ImportResult:
        return from_ai_toolkit(cfg)

    def metrics_parser(self, job: TrainerJob) -> AiToolkitSqlite:
        return AiToolkitSqlite(Path(job.output_dir) / "loss_log.db")

    def artifacts(self, layout: Layout, name: str) -> list[Artifact]:
        root = Path(layout.out) / name
        if not root.is_dir():
            return []
        found: list[Artifact] = []
        pat = re.compile(rf"^{re.escape(name)}_(\d{{9}})\.safetensors$")
        for p in sorted(root.iterdir()):
            m = pat.match(p.name)
            if m:
                # NAME_<its step k>: saved after k + 1 updates (AiToolkitSqlite says why)
                found.append(Artifact("checkpoint", checkpoint_name(int(m.group(1)) + 1), p))
            elif p.name == f"{name}.safetensors":
                found.append(Artifact("final", p.name, p))
        samples = root / "samples"
        if samples.is_dir():
            found += [Artifact("sample", f.name, f) for f in sorted(samples.iterdir()) if f.is_file()]
        return found

    def resume(self, job: TrainerJob, checkpoint: Path) -> None:
        """ai-toolkit continues from the newest ``<name>*.safetensors`` in its save root (step from
        its metadata): the runner links the pulled checkpoint back there before it starts."""
        files = sorted(checkpoint.glob("*.safetensors"))
        if not files:
            raise TrainerRefused(f"{checkpoint} holds no LoRA file to resume from", hint="start a new run")
        job.files[f"{job.output_dir}/{files[0].name}"] = f"@link:{files[0]}"


def _epoch_steps(spec, images: int | None, every_epochs: int | None) -> int | None:
    if not every_epochs or not images:
        return None
    import math

    per_epoch = math.ceil(images * spec.data.repeats / spec.train.micro_batch_size / spec.train.grad_accum)
    return max(1, per_epoch * every_epochs)


# ------------------------------------------------------------------ lorapod import (ai-toolkit job -> spec)

# what the writer's vocabulary (ARCH, KLEIN, OPTIMIZERS, TIMESTEPS) reads back as, plus flex1 (a FLUX.1 arch)
_AITK_FAMILY = {**{arch: fam for fam, arch in ARCH.items()}, **dict.fromkeys(KLEIN.values(), "flux2"), "flex1": "flux1"}
_AITK_TIMESTEPS = {theirs: mine for mine, theirs in TIMESTEPS.items()}
_AITK_OPTIMIZERS = {theirs: mine for mine, theirs in OPTIMIZERS.items()}


def from_ai_toolkit(cfg: dict[str, Any]) -> ImportResult:
    r = ImportResult("ai-toolkit")
    conf = cfg.get("config", {})
    if conf.get("name"):
        r.put("output.name", conf["name"])
    procs = conf.get("process") or [{}]
    if len(procs) > 1:
        r.skip("config.process[1:]", "lorapod runs one training process per spec")
    p = procs[0]
    blocks = {"model": _aitk_model, "network": _aitk_network, "train": _aitk_train, "save": _aitk_save}
    for key, value in p.items():
        if key in ("type", "training_folder", "logging", "device", "sqlite_db_path", "performance_log_every"):
            continue
        if key == "trigger_word":
            r.put("data.trigger", value)
        elif key == "datasets":
            _aitk_datasets(r, value)
        elif key == "sample":
            _aitk_sample(r, value, klein=str((p.get("model") or {}).get("arch", "")).startswith("flux2_klein_"))
        elif key in blocks:
            blocks[key](r, value)
        else:
            r.skip(f"process.{key}")
    r.put("data.format", "images")
    return r


def _aitk_model(r: ImportResult, m: dict) -> None:
    r.put("model.id", m.get("name_or_path"))
    arch = m.get("arch")
    if arch in _AITK_FAMILY:
        r.put("model.family", _AITK_FAMILY[arch])
        if arch.startswith("flux2_klein_"):
            r.put("model.variant", arch.rsplit("_", 1)[1])
    elif arch is not None:
        r.skip("model.arch", f"arch {arch!r}: lorapod trains sd15, sdxl, flux1, flux2 (klein), wan21")
    for k, v in m.items():
        if k in ("name_or_path", "arch", "low_vram", "qtype", "qtype_te", "quantize_te", "model_kwargs"):
            continue
        if k == "quantize":
            if v:
                r.put("model.dtype", "fp8")
        else:
            r.skip(f"model.{k}")


def _aitk_network(r: ImportResult, n: dict) -> None:
    r.put("method.dropout", 0.0)  # NetworkConfig.dropout defaults to None: no dropout
    for k, v in n.items():
        if k == "type":
            if v != "lora":
                r.skip("network.type", f"network {v!r}: lorapod trains LoRA")
        elif k in ("linear", "rank"):
            r.put("method.r", v)
        elif k in ("linear_alpha", "alpha"):
            r.put("method.alpha", v)
        elif k == "dropout":
            r.put("method.dropout", v)
        else:
            r.skip(f"network.{k}")


def _aitk_datasets(r: ImportResult, dss: list[dict]) -> None:
    paths = [str(ds.get("folder_path")) for ds in dss]
    r.put("data.path", paths[0] if len(paths) == 1 else paths)
    ds = dss[0]
    direct = {"caption_dropout_rate": "data.caption_dropout", "shuffle_tokens": "data.shuffle_captions",
              "cache_latents_to_disk": "data.cache_latents", "buckets": "data.buckets", "num_repeats": "data.repeats",
              "flip_x": "data.flip"}
    for k, v in ds.items():
        if k in direct:
            r.put(direct[k], v)
        elif k == "caption_ext":
            r.put("data.caption_extension", "." + str(v).lstrip("."))
        elif k == "resolution":
            res = v if isinstance(v, list) else [v]
            r.put("data.resolution", max(res))
            if len(res) > 1:
                r.skip("datasets[].resolution", f"{res}: lorapod trains at one resolution ({max(res)}) with buckets")
        elif k not in ("folder_path", "keep_tokens", "cache_latents"):
            r.skip(f"datasets[].{k}")


def _aitk_train(r: ImportResult, t: dict) -> None:
    direct = {"batch_size": "train.micro_batch_size", "steps": "train.max_steps", "gradient_accumulation": "train.grad_accum",
              "train_text_encoder": "method.train_text_encoder", "gradient_checkpointing": "train.gradient_checkpointing",
              "lr": "train.learning_rate", "max_grad_norm": "train.max_grad_norm", "noise_offset": "train.noise_offset",
              "min_snr_gamma": "train.min_snr_gamma", "cache_text_embeddings": "data.cache_text_encoder_outputs"}
    for k, v in t.items():
        if k in direct:
            r.put(direct[k], v)
        elif k == "optimizer":
            if v in _AITK_OPTIMIZERS:
                r.put("train.optimizer", _AITK_OPTIMIZERS[v])
            else:
                r.skip("train.optimizer", f"optimizer {v!r}: lorapod has adamw and adamw_8bit")
        elif k == "lr_scheduler":
            decay = (t.get("lr_scheduler_params") or {}) == _AITK_LINEAR_DECAY
            if v == "linear" and not decay:
                r.skip("train.lr_scheduler", "linear with torch LinearLR's default factors warms up (1/3 to the "
                       "full rate, toolkit/scheduler.py); lorapod's linear decays")
            elif v in SCHEDULERS:
                r.put("train.scheduler", v)
            else:
                r.skip("train.lr_scheduler", f"scheduler {v!r}")
        elif k == "lr_scheduler_params" and t.get("lr_scheduler") == "linear" and v == _AITK_LINEAR_DECAY:
            continue
        elif k == "timestep_type":
            if v in _AITK_TIMESTEPS:
                r.put("train.timestep_sampling", _AITK_TIMESTEPS[v])
            else:
                r.skip("train.timestep_type", f"timestep type {v!r}")
        elif k == "dtype":
            r.put("train.precision", {"bf16": "bf16", "fp16": "fp16", "float32": "fp32"}.get(v, "auto"))
        elif k == "lr_scheduler_params" and set(v) <= {"num_warmup_steps"}:
            r.put("train.warmup_steps", v["num_warmup_steps"])
        elif k == "optimizer_params" and set(v) <= {"weight_decay"}:
            r.put("train.weight_decay", v["weight_decay"])
        elif k not in ("train_unet", "noise_scheduler", "disable_sampling"):
            r.skip(f"train.{k}")
    if "lr_scheduler" not in t:
        r.put("train.scheduler", "constant")  # ai-toolkit's default


_AITK_LINEAR_DECAY = {"start_factor": 1.0, "end_factor": 0.0}  # what lorapod writes for its linear


def _aitk_save(r: ImportResult, s: dict) -> None:
    for k, v in s.items():
        if k == "save_every":
            r.put("save.every_steps", v)
            r.put("save.every_epochs", None)
        elif k == "max_step_saves_to_keep":
            r.put("save.keep_last", v)
        elif k != "dtype":
            r.skip(f"save.{k}")


def _aitk_sample(r: ImportResult, s: dict, *, klein: bool) -> None:
    prompts = [x["prompt"] for x in s.get("samples") or []] or list(s.get("prompts") or [])
    if prompts:
        r.put("samples.prompts", prompts)
    for k, v in s.items():
        if k == "sample_every":
            r.put("samples.every_steps", v)
        elif klein and k in KLEIN_SAMPLE and v == KLEIN_SAMPLE[k]:
            continue  # what lorapod writes for FLUX.2 klein (ai-toolkit's UI settings)
        elif k not in ("samples", "prompts", "sampler", "width", "height", "seed", "walk_seed"):
            r.skip(f"sample.{k}")
