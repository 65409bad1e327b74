"""``lorapod import``: an existing trainer config -> a lorapod spec, with every setting that has
no lorapod equivalent reported instead of silently dropped.

Reads an axolotl YAML, an ai-toolkit job YAML (``job: extension``), or an sd-scripts dataset TOML
plus the training command's options (``--flags "..."``; the script name in them, e.g.
``sdxl_train_network.py``, gives the model family). Settings lorapod sets by itself when it
drives the trainer (output folders, logging, caching to disk, save format) are taken as read.
"""

from __future__ import annotations

import shlex
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from lorapod.errors import SpecError
from lorapod.spec import validate

NO_EQUIVALENT = "no lorapod equivalent"


@dataclass
class ImportResult:
    source: str  # axolotl | ai-toolkit | sd-scripts
    spec: dict[str, Any] = field(default_factory=dict)
    unmapped: list[tuple[str, str]] = field(default_factory=list)

    def put(self, dotted: str, value: Any) -> None:
        if dotted == "train.max_grad_norm" and value is not None and not 0 < float(value) < float("inf"):
            value = None  # 0 (kohya, transformers) and infinity (ai-toolkit) clip nothing: lorapod's null
        node = self.spec
        *parents, last = dotted.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[last] = value

    def skip(self, key: str, why: str = NO_EQUIVALENT) -> None:
        self.unmapped.append((key, why))

    def to_yaml(self) -> str:
        validate(self.spec)  # the result is a valid spec, or a SpecError naming the key
        return f"# imported from a {self.source} config by `lorapod import`\n" + yaml.safe_dump(self.spec, sort_keys=False)


def import_file(path: Path, flags: str = "") -> ImportResult:
    path = Path(path)
    if not path.is_file():
        raise SpecError(f"{path} does not exist", hint="pass an axolotl YAML, an ai-toolkit YAML or a dataset TOML")
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".toml":
        try:
            return from_sd_scripts(tomllib.loads(text), flags)
        except tomllib.TOMLDecodeError as exc:
            raise SpecError(f"{path} is not valid TOML: {exc}") from None
    try:
        cfg = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise SpecError(f"{path} is not valid YAML: {exc}") from None
    if isinstance(cfg, dict) and "job" in cfg and "config" in cfg:
        return from_ai_toolkit(cfg)
    if isinstance(cfg, dict) and "base_model" in cfg:
        return from_axolotl(cfg)
    raise SpecError(f"{path} is neither an axolotl config (base_model:) nor an ai-toolkit job (job:, config:)",
                    hint="for sd-scripts pass its dataset TOML and --flags \"...the training options...\"")


# ------------------------------------------------------------------ axolotl

_AX_OPTIM = {"adamw_torch": "adamw", "adamw_torch_fused": "adamw", "adamw_hf": "adamw",
             "adamw_bnb_8bit": "adamw_8bit", "paged_adamw_8bit": "adamw_8bit"}
_SCHEDULERS = ("cosine", "linear", "constant", "constant_with_warmup")
_AX_TAKEN = {"load_in_4bit", "output_dir", "logging_steps", "dynamic_checkpoint", "ds_type", "eval_sample_packing"}
_AX_DIRECT = {"lora_r": "method.r", "lora_alpha": "method.alpha", "lora_dropout": "method.dropout",
              "peft_use_rslora": "method.rslora", "sequence_len": "data.sequence_len", "sample_packing": "data.packing",
              "micro_batch_size": "train.micro_batch_size", "gradient_accumulation_steps": "train.grad_accum",
              "max_steps": "train.max_steps", "learning_rate": "train.learning_rate",
              "warmup_steps": "train.warmup_steps", "warmup_ratio": "train.warmup_ratio",
              "weight_decay": "train.weight_decay", "max_grad_norm": "train.max_grad_norm", "seed": "train.seed",
              "save_steps": "save.every_steps", "save_total_limit": "save.keep_last", "eval_steps": "eval.every_steps",
              "val_set_size": "data.val_split", "revision_of_model": "model.revision",
              "trust_remote_code": "model.trust_remote_code",
              # trackers (trainers/tracking.py writes them)
              "use_tensorboard": "tracking.tensorboard", "wandb_project": "tracking.wandb.project",
              "wandb_entity": "tracking.wandb.entity", "wandb_name": "tracking.wandb.name",
              "wandb_mode": "tracking.wandb.mode"}


def _ax_dataset(r: ImportResult, ds: dict, where: str) -> tuple[str, str | None, bool | None]:
    """(path, lorapod format, assistant-only) of one axolotl dataset entry."""
    fmt: str | None = None
    assistant_only: bool | None = None
    typ = ds.get("type")
    if typ == "alpaca":
        fmt = "alpaca"
    elif typ == "chat_template":
        fields = (ds.get("field_messages", "messages"), (ds.get("message_property_mappings") or {}).get("role", "role"))
        fmt = {("messages", "role"): "messages", ("conversations", "from"): "sharegpt"}.get(fields)
        if fmt is None:
            r.skip(f"{where}.field_messages", f"chat fields {fields} are neither messages/role nor conversations/from")
        roles = ds.get("roles_to_train")
        if roles is not None:
            assistant_only = list(roles) == ["assistant"]
    else:
        r.skip(f"{where}.type", f"dataset type {typ!r}: lorapod reads chat_template (messages, sharegpt) and alpaca")
    known = {"path", "type", "ds_type", "field_messages", "message_property_mappings", "roles", "roles_to_train", "split"}
    for k in ds:
        if k not in known:
            r.skip(f"{where}.{k}")
    return str(ds.get("path")), fmt, assistant_only


def from_axolotl(cfg: dict[str, Any]) -> ImportResult:
    r = ImportResult("axolotl")
    r.put("model.id", str(cfg["base_model"]))
    r.put("model.family", "llm")
    for key, value in cfg.items():
        if key in ("base_model", *_AX_TAKEN):
            continue
        if key in _AX_DIRECT:
            if value is not None:
                r.put(_AX_DIRECT[key], value)
        elif key == "adapter":
            if value in ("lora", "qlora"):
                r.put("method.type", value)
            else:
                r.skip(key, f"adapter {value!r}: lorapod trains lora or qlora")
        elif key == "lora_target_linear":
            if value:
                r.put("method.target_modules", "all-linear")
        elif key == "lora_target_modules":
            r.put("method.target_modules", value)
        elif key == "datasets":
            found = [_ax_dataset(r, ds, f"datasets[{i}]") for i, ds in enumerate(value or [])]
            paths = [p for p, _, _ in found]
            r.put("data.path", paths[0] if len(paths) == 1 else paths)
            fmts = {f for _, f, _ in found if f}
            if len(fmts) == 1:
                r.put("data.format", fmts.pop())
            roles = {a for _, _, a in found if a is not None}
            if len(roles) == 1:
                r.put("data.train_on_assistant_only", roles.pop())
        elif key == "test_datasets":
            r.put("data.val_path", str(value[0]["path"]))
            if len(value) > 1:
                r.skip("test_datasets[1:]", "lorapod takes one validation file")
        elif key == "train_on_inputs":
            r.put("data.train_on_assistant_only", not value)
        elif key == "num_epochs":
            epochs = float(value)
            r.put("train.epochs", max(1, round(epochs)))
            if not epochs.is_integer():
                r.skip(key, f"{value} epochs: lorapod counts whole epochs ({max(1, round(epochs))})")
        elif key == "optimizer":
            if value in _AX_OPTIM:
                r.put("train.optimizer", _AX_OPTIM[value])
            else:
                r.skip(key, f"optimizer {value!r}: lorapod has adamw and adamw_8bit")
        elif key == "lr_scheduler":
            if value in _SCHEDULERS:
                r.put("train.scheduler", value)
            else:
                r.skip(key, f"scheduler {value!r}: lorapod has {', '.join(_SCHEDULERS)}")
        elif key == "attn_implementation":
            if value != "sdpa":  # what lorapod writes (packing isolated, nothing to install)
                r.skip(key, f"{value!r}: lorapod runs axolotl with sdpa")
        elif key == "gradient_checkpointing":
            r.put("train.gradient_checkpointing", bool(value))
            if isinstance(value, str):
                r.skip(key, f"{value!r}: lorapod checkpoints in GPU memory")
        elif key == "bf16":
            if value is True:
                r.put("train.precision", "bf16")
            elif value == "auto":
                r.put("train.precision", "auto")
            elif not cfg.get("fp16"):
                r.put("train.precision", "fp32")
        elif key == "fp16":
            if value:
                r.put("train.precision", "fp16")
        elif key == "saves_per_epoch":
            if value == 1:
                r.put("save.every_epochs", 1)
            else:
                r.skip(key, f"{value} saves per epoch: lorapod saves every N steps or N epochs")
        else:
            r.skip(key)
    return r


# ------------------------------------------------------------------ ai-toolkit

_AITK_FAMILY = {"flux": "flux1", "flex1": "flux1", "sdxl": "sdxl", "sd1": "sd15", "flux2_klein_4b": "flux2",
                "flux2_klein_9b": "flux2"}
_AITK_TIMESTEPS = {"linear": "uniform", "sigmoid": "logit_normal", "shift": "shift"}


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
            if v in ("adamw", "adamw8bit"):
                r.put("train.optimizer", {"adamw": "adamw", "adamw8bit": "adamw_8bit"}[v])
            else:
                r.skip("train.optimizer", f"optimizer {v!r}: lorapod has adamw and adamw_8bit")
        elif k == "lr_scheduler":
            decay = (t.get("lr_scheduler_params") or {}) == _AITK_LINEAR_DECAY
            if v == "linear" and not decay:
                r.skip("train.lr_scheduler", "linear with torch LinearLR's default factors warms up (1/3 to the "
                       "full rate, toolkit/scheduler.py); lorapod's linear decays")
            elif v in _SCHEDULERS:
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
    from lorapod.trainers.ai_toolkit import KLEIN_SAMPLE

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


# ------------------------------------------------------------------ sd-scripts

_KOHYA_FAMILY = {"train_network.py": "sd15", "sdxl_train_network.py": "sdxl", "flux_train_network.py": "flux1"}
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
            if low in ("adamw", "adamw8bit"):
                r.put("train.optimizer", {"adamw": "adamw", "adamw8bit": "adamw_8bit"}[low])
            else:
                r.skip("--optimizer_type", f"optimizer {v!r}: lorapod has AdamW and AdamW8bit")
        elif name == "optimizer_args" and all(a.startswith("weight_decay=") for a in vals):
            r.put("train.weight_decay", float(vals[0].split("=", 1)[1]))
        elif name == "lr_scheduler":
            if v in _SCHEDULERS:
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
