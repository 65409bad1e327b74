"""axolotl: LLM LoRA / QLoRA fine-tunes from one YAML config, ``axolotl train CONFIG``.

axolotl installs from PyPI at the pinned release (0.19.0, which caps torch at 2.13). The config
maps the spec's method (adapter lora/qlora, lora_*), data (datasets of ``type: chat_template``
with the field mapping of the chat format, val_set_size or test_datasets, sequence_len,
sample_packing) and train settings; ``dynamic_checkpoint`` lets lorapod ask for a checkpoint on
STOP (a file ``axolotl_checkpoint.save`` in output_dir). Outputs follow the Hugging Face
Trainer: ``checkpoint-<step>/`` folders and the final adapter (``adapter_model.safetensors``,
``adapter_config.json``) in output_dir. Merging into the base (``axolotl merge-lora``) is printed
as the next step, not run: lorapod keeps the adapter.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from lorapod.catalog.models import is_builtin
from lorapod.rundir.layout import checkpoint_name
from lorapod.trainers.base import Artifact, Layout, Trainer, safe_name
from lorapod.trainers.bridge import HFTrainerLogs
from lorapod.trainers.import_result import SCHEDULERS, ImportResult
from lorapod.trainers.job import Command, TrainerJob, TrainerRefused, dump_yaml
from lorapod.trainers.tracking import run_name

VERSION = "0.19.0"
OPTIMIZERS = {"adamw": "adamw_torch", "adamw_8bit": "adamw_bnb_8bit"}
# chat formats as axolotl's chat_template datasets read them
FORMATS = {
    "messages": {"field_messages": "messages", "message_property_mappings": {"role": "role", "content": "content"}},
    "sharegpt": {"field_messages": "conversations", "message_property_mappings": {"role": "from", "content": "value"},
                 "roles": {"user": ["human"], "assistant": ["gpt"], "system": ["system"]}},
}
ADAPTER_FILES = ("adapter_model.safetensors", "adapter_config.json")
TRIGGER = "axolotl_checkpoint.save"


def chat_format(spec) -> str:
    """The spec's chat format; ``auto`` reads the first line of the first file when it is here."""
    fmt = spec.data.format
    if fmt != "auto":
        return fmt
    path = spec.data_paths()[0]
    if path.is_file():
        with open(path, encoding="utf-8") as fh:
            first = fh.readline()
        try:
            rec = json.loads(first)
        except ValueError:
            return "messages"
        if "conversations" in rec:
            return "sharegpt"
        if "instruction" in rec:
            return "alpaca"
    return "messages"


def dataset_entry(path: str, fmt: str, assistant_only: bool) -> dict:
    if fmt == "alpaca":
        return {"path": path, "ds_type": "json", "type": "alpaca"}
    entry = {"path": path, "ds_type": "json", "type": "chat_template", **FORMATS[fmt]}
    entry["roles_to_train"] = ["assistant"] if assistant_only else ["user", "assistant"]
    return entry


class Axolotl(Trainer):
    name = "axolotl"
    title = "axolotl"
    families = ("llm",)
    contract = "axolotl.json"
    repo = None
    commit = VERSION
    install = (f"axolotl=={VERSION}",)
    torch = "torch>=2.11,<=2.13.0"

    def refuse(self, spec) -> list[str]:
        r = super().refuse(spec)
        if r:
            return r
        if spec.model.dtype == "fp8":
            r.append("axolotl has no fp8 base for LoRA: model.dtype auto/bf16/fp16, or method.type qlora for 4 bits")
        if is_builtin(spec.model.id):
            r.append(f"{spec.model.id} is lorapod's built-in test model; axolotl needs a hub id or a model folder")
        if spec.data.format == "images":
            r.append("axolotl trains on chat data, not images")
        return r

    def build(self, spec, layout: Layout, *, images: int | None = None) -> TrainerJob:
        name = safe_name(spec)
        m, d, t, s = spec.method, spec.data, spec.train, spec.save
        fmt = chat_format(spec)
        cfg: dict = {"base_model": spec.model.id}
        if spec.model.revision:
            cfg["revision_of_model"] = spec.model.revision
        if spec.model.trust_remote_code:
            cfg["trust_remote_code"] = True
        cfg["adapter"] = m.type
        if m.type == "qlora":
            cfg["load_in_4bit"] = True
        cfg.update({"lora_r": m.r, "lora_alpha": _int_if_whole(m.alpha), "lora_dropout": float(m.dropout)})
        if m.target_modules == "all-linear":
            cfg["lora_target_linear"] = True
        else:
            cfg["lora_target_modules"] = [m.target_modules] if isinstance(m.target_modules, str) else list(m.target_modules)
        if m.rslora:
            cfg["peft_use_rslora"] = True
        cfg["datasets"] = [dataset_entry(str(p), fmt, d.train_on_assistant_only) for p in spec.data_paths()]
        if d.val_path:
            cfg["test_datasets"] = [{**dataset_entry(d.val_path, fmt, d.train_on_assistant_only), "split": "train"}]
        else:
            cfg["val_set_size"] = float(d.val_split)
        cfg.update({"sequence_len": d.sequence_len, "sample_packing": d.packing})
        # A packed batch isolates its examples only with a backend that does (axolotl 0.19.0
        # utils/schemas/config.py attn_decontaminates_packing: flash/flex, or sdpa/eager through the
        # block-diagonal mask); without one it warns "does not handle cross-sample decontamination".
        # sdpa needs nothing installed.
        cfg["attn_implementation"] = "sdpa"
        if fmt == "alpaca":
            cfg["train_on_inputs"] = not d.train_on_assistant_only
        cfg.update({"micro_batch_size": t.micro_batch_size, "gradient_accumulation_steps": t.grad_accum,
                    "num_epochs": float(t.epochs)})
        if t.max_steps:
            cfg["max_steps"] = t.max_steps
        cfg.update({"optimizer": OPTIMIZERS[t.optimizer], "lr_scheduler": t.scheduler,
                    "learning_rate": float(t.learning_rate)})
        if t.warmup_steps:
            cfg["warmup_steps"] = t.warmup_steps
        elif t.warmup_ratio:
            cfg["warmup_ratio"] = float(t.warmup_ratio)
        cfg["weight_decay"] = float(t.weight_decay)
        # axolotl passes it on only when set (core/builders/base.py), and transformers' default is
        # 1.0; its Trainer clips only when max_grad_norm > 0 ("0 to disable")
        cfg["max_grad_norm"] = float(t.max_grad_norm or 0.0)
        cfg["gradient_checkpointing"] = t.gradient_checkpointing
        prec = t.precision
        cfg["bf16"] = {"auto": "auto", "bf16": True}.get(prec, False)
        if prec == "fp16":
            cfg["fp16"] = True
        cfg.update({"seed": t.seed, "output_dir": layout.out, "logging_steps": 1})
        cfg.update(self.tracker_fields(spec))
        if s.every_steps:
            cfg["save_steps"] = s.every_steps
        elif s.every_epochs:
            cfg["saves_per_epoch"] = 1
        cfg["save_total_limit"] = s.keep_last
        if spec.eval.every_steps:
            cfg["eval_steps"] = spec.eval.every_steps
        cfg["dynamic_checkpoint"] = {"enabled": True, "check_interval": 1}
        notes = []
        if s.every_epochs and s.every_epochs > 1 and not s.every_steps:
            notes.append(f"save.every_epochs {s.every_epochs}: axolotl saves every epoch (saves_per_epoch 1)")
        if spec.eval.at_start:
            notes.append("eval.at_start has no effect: axolotl evaluates during training only")
        if d.skip_bad_examples:
            notes.append("data.skip_bad_examples: axolotl drops examples it cannot tokenize on its own terms")
        path = f"{layout.job}/axolotl.yaml"
        train = Command("train", ["env", "AXOLOTL_DO_NOT_TRACK=1", layout.python, "-m", "axolotl.cli.train", path],
                        "train")
        notes.append(f"to merge the adapter into the base afterwards: axolotl merge-lora {path} "
                     f"--lora-model-dir={layout.out}")
        return TrainerJob(self.name, {path: dump_yaml(cfg)}, self.setup_commands(layout, layout.python), [train],
                          layout.out, name, notes, config=cfg)

    @staticmethod
    def tracker_fields(spec) -> dict:
        """The spec's trackers as axolotl's own fields: ``wandb_project``, ``wandb_entity``,
        ``wandb_name``, ``wandb_mode`` and ``use_tensorboard`` (its WandbConfig and
        HyperparametersConfig fields in the recorded schema)."""
        t = spec.tracking
        out: dict = {}
        if t.tensorboard:
            out["use_tensorboard"] = True
        w = t.wandb
        if w is not None:
            out.update({"wandb_project": w.project, "wandb_name": run_name(spec)})
            if w.entity:
                out["wandb_entity"] = w.entity
            if w.mode:
                out["wandb_mode"] = w.mode
        return out

    # ---------------------------------------------------------------- lorapod import

    config_kind = "an axolotl config (base_model:)"

    @classmethod
    def reads_config(cls, path: Path, cfg: Any) -> bool:
        return isinstance(cfg, dict) and "base_model" in cfg

    def import_config(self, cfg: Any, flags: str = "") -> ImportResult:
        return from_axolotl(cfg)

    def metrics_parser(self, job: TrainerJob) -> HFTrainerLogs:
        return HFTrainerLogs()

    def artifacts(self, layout: Layout, name: str) -> list[Artifact]:
        out = Path(layout.out)
        if not out.is_dir():
            return []
        found = [Artifact("checkpoint", checkpoint_name(int(m.group(1))), p) for p in sorted(out.iterdir())
                 if p.is_dir() and (m := re.match(r"^checkpoint-(\d+)$", p.name))]
        if all((out / f).is_file() for f in ADAPTER_FILES):
            found += [Artifact("final", f, out / f) for f in ADAPTER_FILES]
        return found

    def stop_trigger(self, layout: Layout) -> Path | None:
        return Path(layout.out) / TRIGGER

    def resume(self, job: TrainerJob, checkpoint: Path) -> None:
        if not (checkpoint / "trainer_state.json").is_file():
            raise TrainerRefused(f"{checkpoint} is not a Trainer checkpoint (no trainer_state.json)", hint="start a new run")
        assert job.config is not None
        job.config["resume_from_checkpoint"] = str(checkpoint)
        path = next(p for p in job.files if p.endswith("axolotl.yaml"))
        job.files[path] = dump_yaml(job.config)


def _int_if_whole(x: float) -> int | float:
    return int(x) if float(x).is_integer() else float(x)


# ------------------------------------------------------------------ lorapod import (axolotl -> spec)

# axolotl passes ``optimizer`` on to transformers' TrainingArguments.optim (its recorded contract:
# any string), so its names are transformers' (training_args.py OptimizerNames, 5.16.1 as axolotl
# 0.19.0 pins it), and what each runs is transformers' dispatch (trainer_optimizer.py
# _OPTIMIZER_HANDLERS): torch's AdamW for adamw_torch(_fused), bitsandbytes' 8-bit AdamW for
# adamw_bnb_8bit, its alias adamw_8bit (the LLM guide's) and paged_adamw_8bit. Written: OPTIMIZERS.
LEGACY_OPTIMIZERS = {"adamw_hf": "adamw"}  # transformers 4.x's own AdamW, gone in 5.x
IMPORTED_OPTIMIZERS = {**{v: k for k, v in OPTIMIZERS.items()}, "adamw_torch_fused": "adamw",
                       "adamw_8bit": "adamw_8bit", "paged_adamw_8bit": "adamw_8bit", **LEGACY_OPTIMIZERS}
# taken as read: lorapod writes them itself, or (load_in_8bit false, load_in_4bit) what the adapter says
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
              # trackers (Axolotl.tracker_fields writes them)
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
            if value in IMPORTED_OPTIMIZERS:
                r.put("train.optimizer", IMPORTED_OPTIMIZERS[value])
            else:
                names = {mine: ", ".join(n for n, m in IMPORTED_OPTIMIZERS.items() if m == mine and n not in LEGACY_OPTIMIZERS)
                         for mine in OPTIMIZERS}
                r.skip(key, f"optimizer {value!r}: lorapod has " + " and ".join(f"{m} ({n})" for m, n in names.items()))
        elif key == "load_in_8bit":
            if value:
                r.skip(key, "an 8-bit base (LLM.int8): lorapod's lora keeps the base in bf16/fp16, "
                            "its qlora in 4-bit (adapter: qlora)")
        elif key == "lr_scheduler":
            if value in SCHEDULERS:
                r.put("train.scheduler", value)
            else:
                r.skip(key, f"scheduler {value!r}: lorapod has {', '.join(SCHEDULERS)}")
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
