"""Run one trainer's own code on lorapod's emitted jobs; print what it did as JSON.

    python tools/upstream/probes.py TRAINER CHECKOUT REQUEST.json OUT.json

Runs under the trainer's Python (a CPU virtualenv with its requirements), with its checkout on
``sys.path``; imports nothing of lorapod's. For each case in the request it runs the trainer's
parser, verifiers, dataset sanitizer and dataset builder, config loader, scheduler and logger,
each step under its own ``try``, and reports per step either the facts it read or the exception
the trainer raised (class and message, as the user would see them). The driver,
tools/upstream_check.py, compares them with what lorapod meant. ``record`` requests also dump the
interfaces lorapod's recorded contracts hold (argparse actions, dataset schemas, config classes).

Import-time stand-ins, each for a reason the trainer's own code gives (nothing else is patched):
- ``torchaudio``: ai-toolkit's toolkit/config_modules.py imports it at the top; there is no
  torchaudio wheel for the CPU torch 2.13 this runs on, and no image-LoRA path calls it.
- ``torch.cuda.current_device``: musubi-tuner's wan/modules/t5.py calls it at import time.
- ``torchvision._meta_registrations``: the PyPI torchvision wheel is built against CUDA torch, so
  its fake-op registrations for ``torchvision::nms`` and friends fail on CPU torch at import; the
  kohya trainers import torchvision only for ``transforms`` (library/utils.py), which needs none.
"""

# Each stage is a closure that step() calls at once, inside its loop iteration: late binding cannot bite.
# ruff: noqa: B023

from __future__ import annotations

import argparse
import ast
import contextlib
import importlib
import inspect
import io
import json
import logging
import os
import sqlite3
import sys
import tempfile
import traceback
import types
from pathlib import Path
from typing import Any


def _torchvision_on_cpu_torch() -> None:
    """See the module docstring: skip the fake-op registrations a CUDA-built torchvision cannot make."""
    try:
        import torchvision  # noqa: F401
    except RuntimeError:
        for name in [m for m in sys.modules if m.startswith("torchvision")]:
            del sys.modules[name]
        sys.modules["torchvision._meta_registrations"] = types.ModuleType("torchvision._meta_registrations")
    except ImportError:
        pass


def _err(exc: BaseException) -> dict:
    """The exception as the user sees its last line, plus where in the trainer it was raised."""
    tb = traceback.extract_tb(exc.__traceback__)
    where = next((f"{Path(f.filename).name}:{f.lineno}" for f in reversed(tb)), "")
    return {"error": f"{type(exc).__name__}: {exc}".strip(), "at": where}


def step(out: dict, name: str, fn):
    """Run one stage; its result or the trainer's exception goes into ``out[name]``."""
    buf = io.StringIO()
    try:
        with contextlib.redirect_stdout(buf):
            value = fn()
        out[name] = {"ok": True, "value": value}
        return value
    except SystemExit as exc:  # argparse's error() exits 2 after printing to stderr
        out[name] = {"ok": False, "error": f"SystemExit: {exc.code}", "at": "argparse"}
    except BaseException as exc:
        out[name] = {"ok": False, **_err(exc)}
    return None


def _warnings() -> list[str]:
    """Collect log records of level WARNING and above (axolotl's validators warn through logging)."""
    seen: list[str] = []

    class H(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record.getMessage())

    h = H(level=logging.WARNING)
    logging.getLogger().addHandler(h)
    return seen


def _json(v: Any) -> Any:
    if isinstance(v, dict):
        return {str(k): _json(x) for k, x in v.items()}
    if isinstance(v, list | tuple | set):
        return [_json(x) for x in v]
    if isinstance(v, float) and v != v:
        return "nan"
    if isinstance(v, str | int | float | bool) or v is None:
        return v
    return repr(v)


def rates(sched, opt, steps: int) -> list[float]:
    out = []
    for _ in range(steps):
        out.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return out


# ------------------------------------------------------------------ argparse dumps (record)

_DEFINED: dict[int, str] = {}


def _track_add_argument() -> None:
    """Remember where each option was added (file:line (function)), for the recorded contracts."""
    orig = argparse._ActionsContainer.add_argument

    def add_argument(self, *a, **kw):
        action = orig(self, *a, **kw)
        frame = next(f for f in inspect.stack()[1:] if Path(f.filename).name != "argparse.py")  # -h: the parser's maker
        src = Path(frame.filename)
        with contextlib.suppress(ValueError):
            src = src.relative_to(Path.cwd())
        _DEFINED[id(action)] = f"{src}:{frame.lineno} ({frame.function})"
        return action

    argparse._ActionsContainer.add_argument = add_argument


def _first_sentence(text: str | None) -> str | None:
    """The help text up to its first full stop (kept), the form the recorded contracts use."""
    if not text:
        return None
    head = text.split(" / ")[0].strip()  # kohya's help is "English / 日本語"
    cut = head.find(". ")
    return head[: cut + 1] if cut >= 0 else head


def dump_parser(parser: argparse.ArgumentParser) -> list[dict]:
    opts = []
    for a in parser._actions:
        typ = getattr(a.type, "__name__", None) if a.type is not None else None
        opts.append({"flags": list(a.option_strings) or [a.dest], "dest": a.dest,
                     "action": {argparse._StoreTrueAction: "store_true", argparse._StoreFalseAction: "store_false",
                                argparse._StoreConstAction: "store_const", argparse._AppendAction: "append",
                                argparse._CountAction: "count", argparse._HelpAction: "help"}.get(type(a), "store"),
                     "type": typ, "default": _json(a.default), "choices": _json(a.choices),
                     "nargs": a.nargs, "const": _json(a.const), "required": a.required,
                     "metavar": _json(a.metavar), "help_first_sentence": _first_sentence(a.help),
                     "defined_at": _DEFINED.get(id(a))})
    return opts


def dump_voluptuous(schema) -> dict:
    """key -> {type, required} of a sanitizer's schema dict (the form the recorded contracts use)."""
    import functools

    import voluptuous

    def name(t) -> str:
        if isinstance(t, functools.partial):  # config_util's __validate_and_convert_* helpers
            k = name(t.args[0])
            if "scalar_or_twodim" in t.func.__name__:
                return f"{k} | [{k}, {k}]  (scalar is expanded to a pair)"
            return f"[{k}, {k}]"
        if isinstance(t, type):
            return t.__name__
        if isinstance(t, voluptuous.Any):
            return " | ".join(name(v) for v in t.validators)
        if isinstance(t, list):
            return f"list[{', '.join(name(v) for v in t)}]" if t else "list"
        if isinstance(t, voluptuous.All):
            return " & ".join(name(v) for v in t.validators)
        if isinstance(t, voluptuous.ExactSequence):
            return "[" + ", ".join(name(v) for v in t.validators) + "]"
        if isinstance(t, dict):
            return "dict"
        return getattr(t, "__name__", type(t).__name__)

    items = schema.schema.items() if isinstance(schema, voluptuous.Schema) else schema.items()
    out = {}
    for key, typ in items:
        k = key.schema if isinstance(key, voluptuous.Marker) else key
        if k == "subsets":
            continue  # the nested subset level, recorded on its own
        out[str(k)] = {"type": name(typ), "required": isinstance(key, voluptuous.Required)}
    return dict(sorted(out.items()))


# ------------------------------------------------------------------ kohya sd-scripts


def sd_scripts(src: Path, req: dict) -> dict:
    sys.path.insert(0, str(src))
    os.chdir(src)
    if req.get("record"):
        _track_add_argument()
    _torchvision_on_cpu_torch()
    from library import config_util, train_util
    from library.config_util import BlueprintGenerator, ConfigSanitizer

    trainers = {"train_network.py": ("train_network", "NetworkTrainer"),
                "sdxl_train_network.py": ("sdxl_train_network", "SdxlNetworkTrainer"),
                "flux_train_network.py": ("flux_train_network", "FluxNetworkTrainer")}
    result: dict = {"cases": {}}
    for case in req["cases"]:
        out: dict = {}
        modname, cls = trainers[case["script"]]
        mod = importlib.import_module(modname)
        args = step(out, "parse", lambda: mod.setup_parser().parse_args(case["argv"]))
        if args is None:
            result["cases"][case["name"]] = out
            continue
        out["args"] = {k: _json(v) for k, v in vars(args).items() if k in case.get("read", ())}

        def verify(args=args):
            train_util.verify_training_args(args)
            train_util.prepare_dataset_args(args, True)
            if case["script"] == "sdxl_train_network.py":
                from library import sdxl_train_util

                sdxl_train_util.verify_sdxl_training_args(args)

        step(out, "verify", verify)

        def dataset(args=args):
            user = config_util.load_user_config(args.dataset_config)
            bp = BlueprintGenerator(ConfigSanitizer(True, True, args.masked_loss, True)).generate(user, args)
            group, val = config_util.generate_dataset_group_by_blueprint(bp.dataset_group)
            return group, val

        made = step(out, "dataset", dataset)
        if made is not None:
            group, val = made
            out["dataset"]["value"] = {"items": len(group),
                                       "images": sum(ds.num_train_images for ds in group.datasets),
                                       "subsets": [str(s.image_dir) for ds in group.datasets for s in ds.subsets]}
            step(out, "assert_extra_args", lambda: getattr(mod, cls)().assert_extra_args(args, group, val))

        def names(args=args):
            ext = ".safetensors"
            return {"final": train_util.get_last_ckpt_name(args, ext),
                    "epoch": train_util.get_epoch_ckpt_name(args, ext, 2),
                    "step": train_util.get_step_ckpt_name(args, ext, 500),
                    "epoch_state": train_util.EPOCH_STATE_NAME.format(args.output_name, 2),
                    "step_state": train_util.STEP_STATE_NAME.format(args.output_name, 500),
                    "last_state": train_util.LAST_STATE_NAME.format(args.output_name)}

        step(out, "names", names)

        def kept(args=args):
            every, total = args.save_every_n_steps, case["steps"]
            if not every:
                return None
            files: set[int] = set()
            for s in range(every, total + 1, every):  # save_and_remove_state_stepwise / save_sd_model_on_epoch_end_or_stepwise
                files.add(s)
                r = train_util.get_remove_step_no(args, s)
                if r is not None:
                    files.discard(r)
            return sorted(files)

        step(out, "kept_steps", kept)

        def schedule(args=args):
            import torch

            opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=args.learning_rate)
            a = argparse.Namespace(**vars(args))
            a.max_train_steps = case["steps"]
            if isinstance(a.lr_warmup_steps, float):  # train_network.py resolves a ratio before get_scheduler_fix
                a.lr_warmup_steps = int(a.lr_warmup_steps * a.max_train_steps)
            return rates(train_util.get_scheduler_fix(a, opt, 1), opt, case["steps"])

        step(out, "schedule", schedule)
        result["cases"][case["name"]] = out
    if req.get("record"):
        result["parsers"] = {s: dump_parser(importlib.import_module(m).setup_parser()) for s, (m, _) in trainers.items()}
        result["dataset_schema"] = {}
        for masked in (False, True):
            san = ConfigSanitizer(True, True, masked, True)
            result["dataset_schema"][f"schema_when_masked_loss_{str(masked).lower()}"] = {
                "general": dump_voluptuous(san.general_schema),
                "dreambooth_dataset": dump_voluptuous(san.db_dataset_schema),
                "dreambooth_subset": dump_voluptuous(san.db_subset_schema)}
    return result


# ------------------------------------------------------------------ kohya musubi-tuner


def musubi(src: Path, req: dict) -> dict:
    sys.path.insert(0, str(src / "src"))
    os.chdir(src)
    if req.get("record"):
        _track_add_argument()
    import torch

    _torchvision_on_cpu_torch()
    torch.cuda.current_device = lambda: 0  # wan/modules/t5.py calls it at import (module docstring)
    from musubi_tuner import (
        cache_latents,
        cache_text_encoder_outputs,
        hv_train_network,
        qwen_image_cache_latents,
        qwen_image_cache_text_encoder_outputs,
        qwen_image_train_network,
        wan_cache_latents,
        wan_cache_text_encoder_outputs,
        wan_train_network,
        zimage_cache_text_encoder_outputs,
        zimage_train_network,
    )
    from musubi_tuner.dataset import config_utils
    from musubi_tuner.dataset.architectures import ARCHITECTURE_QWEN_IMAGE, ARCHITECTURE_Z_IMAGE
    from musubi_tuner.dataset.config_utils import BlueprintGenerator, ConfigSanitizer
    from musubi_tuner.dataset.image_video_dataset import ARCHITECTURE_WAN
    from musubi_tuner.qwen_image import qwen_image_utils
    from musubi_tuner.utils import train_utils

    # each family's training script as its main() builds it: (parser, trainer class, dataset architecture)
    def wan_parser():
        return wan_train_network.wan_setup_parser(hv_train_network.setup_parser_common())

    def zimage_parser():
        return zimage_train_network.zimage_setup_parser(hv_train_network.setup_parser_common())

    def qwen_parser():
        return qwen_image_train_network.qwen_image_setup_parser(hv_train_network.setup_parser_common())

    trains = {"wan_train_network.py": (wan_parser, wan_train_network.WanNetworkTrainer, ARCHITECTURE_WAN),
              "zimage_train_network.py": (zimage_parser, zimage_train_network.ZImageNetworkTrainer, ARCHITECTURE_Z_IMAGE),
              "qwen_image_train_network.py": (qwen_parser, qwen_image_train_network.QwenImageNetworkTrainer,
                                              ARCHITECTURE_QWEN_IMAGE)}

    def cache_parsers():
        """Each cache script's parser as its main() builds it."""
        common_lat, common_te = cache_latents.setup_parser_common, cache_text_encoder_outputs.setup_parser_common
        return {
            "wan_cache_latents.py": wan_cache_latents.wan_setup_parser(common_lat()),
            "wan_cache_text_encoder_outputs.py": wan_cache_text_encoder_outputs.wan_setup_parser(common_te()),
            "zimage_cache_latents.py": common_lat(),  # its main() adds nothing to the common parser
            "zimage_cache_text_encoder_outputs.py": zimage_cache_text_encoder_outputs.zimage_setup_parser(common_te()),
            "qwen_image_cache_latents.py": qwen_image_cache_latents.qwen_image_setup_parser(
                cache_latents.hv_setup_parser(common_lat())),
            "qwen_image_cache_text_encoder_outputs.py":
                qwen_image_cache_text_encoder_outputs.qwen_image_setup_parser(common_te()),
        }

    result: dict = {"cases": {}}
    for case in req["cases"]:
        out: dict = {}
        make_parser, trainer_cls, architecture = trains[case.get("script", "wan_train_network.py")]
        for script, argv in case.get("prepare", {}).items():
            step(out, f"parse {script}", lambda script=script, argv=argv: bool(cache_parsers()[script].parse_args(argv)))

        def parse(make_parser=make_parser):
            args = hv_train_network.read_config_from_file(make_parser().parse_args(case["argv"]), make_parser())
            if make_parser is qwen_parser:
                qwen_image_utils.resolve_model_version_args(args)  # as its main() does before training
            return args

        args = step(out, "parse", parse)
        if args is None:
            result["cases"][case["name"]] = out
            continue
        out["args"] = {k: _json(v) for k, v in vars(args).items() if k in case.get("read", ())}
        step(out, "model_args", lambda: trainer_cls().handle_model_specific_args(args))

        def dataset(args=args, architecture=architecture):
            user = config_utils.load_user_config(args.dataset_config)
            bp = BlueprintGenerator(ConfigSanitizer()).generate(user, args, architecture=architecture)
            group = config_utils.generate_dataset_group_by_blueprint(bp.dataset_group)
            found = []
            for ds in group.datasets:  # what wan_cache_latents.py encodes: every item of every dataset
                for _, batch in ds.retrieve_latent_cache_batches(1):
                    for item in batch:
                        frames = len(item.content) if getattr(item.content, "ndim", 3) == 4 else 1
                        found.append({"item": Path(item.item_key).name, "frames": frames,
                                      "kind": type(ds).__name__})
            return sorted(found, key=lambda x: (x["item"], x["frames"]))

        step(out, "dataset", dataset)

        def kept(args=args):
            every, total = args.save_every_n_steps, case["steps"]
            if not every:
                return None
            files: set[int] = set()
            for s in range(every, total + 1, every):
                files.add(s)
                r = train_utils.get_remove_step_no(args, s)
                if r is not None:
                    files.discard(r)
            return sorted(files)

        step(out, "kept_steps", kept)

        def names(args=args):
            n = args.output_name
            return {"final": train_utils.get_last_ckpt_name(n), "epoch": train_utils.get_epoch_ckpt_name(n, 2),
                    "step": train_utils.get_step_ckpt_name(n, 500),
                    "epoch_state": train_utils.EPOCH_STATE_NAME.format(n, 2),
                    "step_state": train_utils.STEP_STATE_NAME.format(n, 500),
                    "last_state": train_utils.LAST_STATE_NAME.format(n)}

        step(out, "names", names)
        result["cases"][case["name"]] = out
    if req.get("record"):
        result["parsers"] = {**{f"src/musubi_tuner/{k}": dump_parser(v[0]()) for k, v in trains.items()},
                             **{f"src/musubi_tuner/{k}": dump_parser(v) for k, v in cache_parsers().items()}}
        san = ConfigSanitizer()
        result["dataset_schema"] = {"general": dump_voluptuous(san.general_schema),
                                    "image_dataset": dump_voluptuous(san.image_dataset_schema),
                                    "video_dataset": dump_voluptuous(san.video_dataset_schema)}
    return result


# ------------------------------------------------------------------ ostris ai-toolkit


def _aitk_fields(src: Path) -> dict[str, dict[str, Any]]:
    """Every ``kwargs.get('key', default)`` in each class of toolkit/config_modules.py (the keys a
    config class reads; ai-toolkit ignores the others without a word)."""
    tree = ast.parse((src / "toolkit" / "config_modules.py").read_text(encoding="utf-8"))
    classes: dict[str, dict[str, Any]] = {}
    for node in tree.body:
        if not isinstance(node, ast.ClassDef):
            continue
        fields: dict[str, Any] = {}
        for sub in ast.walk(node):
            if (isinstance(sub, ast.Call) and isinstance(sub.func, ast.Attribute) and sub.func.attr == "get"
                    and isinstance(sub.func.value, ast.Name) and sub.func.value.id == "kwargs"
                    and sub.args and isinstance(sub.args[0], ast.Constant) and isinstance(sub.args[0].value, str)):
                default = sub.args[1] if len(sub.args) > 1 else None
                try:
                    value = ast.literal_eval(default) if default is not None else None
                    fields.setdefault(sub.args[0].value, {"default": _json(value), "line": sub.lineno})
                except ValueError:
                    fields.setdefault(sub.args[0].value, {"default_src": ast.unparse(default), "line": sub.lineno})
        classes[node.name] = dict(sorted(fields.items()))
    return classes


def _aitk_archs(src: Path) -> list[str]:
    """The archs ai-toolkit can load: the ``arch`` of each class listed in toolkit/util/get_model.py
    BUILT_IN_MODELS or an extension's ``AI_TOOLKIT_MODELS`` (get_model_class looks in those)."""
    arch_of: dict[str, str] = {}
    registered: set[str] = set()
    for folder in ("toolkit", "extensions_built_in"):
        for f in (src / folder).rglob("*.py"):
            try:
                tree = ast.parse(f.read_text(encoding="utf-8"))
            except (SyntaxError, UnicodeDecodeError):
                continue
            for node in ast.walk(tree):
                if isinstance(node, ast.ClassDef):
                    for st in node.body:
                        if (isinstance(st, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "arch"
                                                               for t in st.targets)
                                and isinstance(st.value, ast.Constant) and isinstance(st.value.value, str)):
                            arch_of[node.name] = st.value.value
                elif (isinstance(node, ast.Assign) and isinstance(node.value, ast.List)
                      and any(isinstance(t, ast.Name) and t.id in ("BUILT_IN_MODELS", "AI_TOOLKIT_MODELS")
                              for t in node.targets)):
                    registered |= {e.id for e in node.value.elts if isinstance(e, ast.Name)}
    return sorted({arch_of[c] for c in registered if c in arch_of})


def ai_toolkit(src: Path, req: dict) -> dict:
    sys.path.insert(0, str(src))
    os.chdir(src)
    if "torchaudio" not in sys.modules:  # see the module docstring
        import importlib.machinery

        stub = types.ModuleType("torchaudio")
        stub.__spec__ = importlib.machinery.ModuleSpec("torchaudio", None)
        sys.modules["torchaudio"] = stub
    import torch
    from toolkit import config_modules as cm
    from toolkit.config import get_config
    from toolkit.logging_aitk import UILogger
    from toolkit.scheduler import get_lr_scheduler

    fields = _aitk_fields(src)
    archs = _aitk_archs(src)
    classes = {"model": cm.ModelConfig, "network": cm.NetworkConfig, "train": cm.TrainConfig, "save": cm.SaveConfig,
               "sample": cm.SampleConfig, "logging": cm.LoggingConfig, "datasets": cm.DatasetConfig}
    result: dict = {"cases": {}, "archs": archs}
    for case in req["cases"]:
        out: dict = {}
        cfg = step(out, "get_config", lambda: get_config(case["config_path"]))
        if cfg is None:
            result["cases"][case["name"]] = out
            continue
        proc = cfg["config"]["process"][0]
        unread = []
        for key, cls in classes.items():
            for item in (proc.get(key) if isinstance(proc.get(key), list) else [proc.get(key)]):
                if item is None:
                    continue
                step(out, f"{cls.__name__}", lambda cls=cls, item=item: bool(cls(**item)))
                unread += [f"{key}.{k}" for k in item if k not in fields[cls.__name__] and k != "samples"]
        out["unread_keys"] = unread
        out["arch_registered"] = proc.get("model", {}).get("arch") in archs or proc.get("model", {}).get("arch") in (
            "sd1", "sdxl", "flux")
        train = step(out, "train_config", lambda: cm.TrainConfig(**proc["train"]))
        if train is not None:
            out["train_config"]["value"] = {"max_grad_norm": _json(train.max_grad_norm), "steps": train.steps,
                                            "lr_scheduler": train.lr_scheduler}

            def schedule(train=train):
                opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=train.lr)
                params = dict(train.lr_scheduler_params)
                if "max_iterations" not in params:  # BaseSDTrainProcess, before get_lr_scheduler
                    params["total_iters"] = train.steps
                return rates(get_lr_scheduler(train.lr_scheduler, opt, **params), opt, train.steps)

            step(out, "schedule", schedule)

            def clipped(train=train):
                p = torch.nn.Parameter(torch.zeros(2))
                p.grad = torch.tensor([30.0, 40.0])
                torch.nn.utils.clip_grad_norm_([p], train.max_grad_norm)  # SDTrainer: accelerator.clip_grad_norm_
                return p.grad.tolist()

            step(out, "clip", clipped)
        if proc.get("sample"):
            sample = step(out, "sample_config", lambda: cm.SampleConfig(**proc["sample"]))
            if sample is not None:
                out["sample_config"]["value"] = {"guidance_scale": sample.guidance_scale,
                                                 "sample_steps": sample.sample_steps}

        def logger():
            db = Path(tempfile.mkdtemp()) / "loss_log.db"
            lg = UILogger(str(db))
            lg.start()
            for s, loss in ((0, 0.5), (1, 0.4375)):  # BaseSDTrainProcess: learning_rate, then loss/<key> of loss_dict
                lg.log({"learning_rate": float(proc["train"]["lr"])})
                lg.log({"loss/loss": loss})
                lg.commit(step=s)
            lg.finish()
            return str(db)

        step(out, "logger", logger)
        result["cases"][case["name"]] = out
    if req.get("record"):
        db = Path(tempfile.mkdtemp()) / "loss_log.db"
        lg = UILogger(str(db))
        lg.start()
        for s, loss in ((0, 0.5), (1, 0.4375)):
            lg.log({"learning_rate": 2e-05})
            lg.log({"loss/loss": loss})
            lg.commit(step=s)
        lg.finish()
        con = sqlite3.connect(db)
        dump = "\n".join(ln for ln in con.iterdump() if not ln.startswith('INSERT INTO "steps"')) + "\n"
        steps = [f'INSERT INTO "steps" VALUES({s},{1764547200.0 + s});' for s in (0, 1)]  # wall times fixed
        result["loss_log_sql"] = dump.replace("CREATE INDEX", "\n".join(steps) + "\nCREATE INDEX", 1)
        con.close()
        result["config_fields"] = fields
    return result


# ------------------------------------------------------------------ axolotl


def axolotl(src: Path | None, req: dict) -> dict:
    os.environ.setdefault("AXOLOTL_DO_NOT_TRACK", "1")
    from axolotl.utils.config import validate_config
    from axolotl.utils.dict import DictDefault

    result: dict = {"cases": {}}
    for case in req["cases"]:
        out: dict = {}
        warned = _warnings()
        cfg = case["config"]
        valid = step(out, "validate_config", lambda cfg=cfg: validate_config(DictDefault(cfg)))
        out["warnings"] = list(warned)
        if valid is not None:
            out["dropped"] = sorted(k for k in cfg if k not in valid)
            out["changed"] = sorted(k for k in cfg if k in valid and _json(valid[k]) != _json(cfg[k]))
            out["validate_config"]["value"] = {"max_grad_norm": valid.get("max_grad_norm"),
                                               "attn_decontaminates_packing": bool(
                                                   valid.get("attn_decontaminates_packing"))}
        result["cases"][case["name"]] = out
    if req.get("record"):
        from axolotl.utils.schemas.config import AxolotlInputConfig
        from pydantic.json_schema import GenerateJsonSchema

        class Schema(GenerateJsonSchema):
            def enum_schema(self, schema):  # an enum of torch dtypes has no JSON form: name them
                try:
                    return super().enum_schema(schema)
                except Exception:
                    return {"enum": [str(m.value) for m in schema["members"]], "title": schema["cls"].__name__,
                            "x-note": "enum values are non-JSON objects (e.g. torch.dtype); str() shown"}

        result["json_schema"] = AxolotlInputConfig.model_json_schema(schema_generator=Schema)
    return result


def main() -> int:
    trainer, checkout, request, output = sys.argv[1:5]
    req = json.loads(Path(request).read_text())
    run = {"sd-scripts": sd_scripts, "musubi-tuner": musubi, "ai-toolkit": ai_toolkit, "axolotl": axolotl}[trainer]
    result = run(Path(checkout) if checkout != "-" else None, req)
    Path(output).write_text(json.dumps(result, indent=1, default=repr))
    return 0


if __name__ == "__main__":
    sys.exit(main())
