"""The recorded interfaces of the pinned trainers, and the checks lorapod runs against them.

The JSON files beside this module were recorded from each trainer's upstream source at the
commit (or PyPI release) the adapters pin (see README.md here). lorapod checks every option it
emits before anything is rented: a flag the pinned sd-scripts parser does not have, a dataset
TOML key its voluptuous schema rejects, an ai-toolkit YAML key no config class reads, an axolotl
key its config model does not define, or a value of the wrong type. ai-toolkit and axolotl ignore
unknown keys themselves, which is why lorapod must not rely on them to complain.
"""

from __future__ import annotations

import json
import tomllib
from functools import cache
from pathlib import Path
from typing import Any

from lorapod.trainers.job import TrainerJob, TrainerRefused

HERE = Path(__file__).resolve().parent


@cache
def load(name: str) -> dict[str, Any]:
    return json.loads((HERE / name).read_text(encoding="utf-8"))


class ContractError(TrainerRefused):
    """lorapod would emit an option the pinned trainer does not accept (a lorapod bug or an
    unsupported combination); reported before anything is rented."""


def _fail(trainer, problems: list[str]) -> None:
    if problems:
        raise ContractError(f"{trainer.title} at {trainer.commit or trainer.name} would reject the generated "
                            "config:\n  - " + "\n  - ".join(problems),
                            hint="change the spec setting named above, or pick another --trainer")


# ------------------------------------------------------------------ argparse (kohya scripts)

def script_options(contract: str, script: str) -> dict[str, dict]:
    """flag -> recorded option, for every flag spelling of the script's parser."""
    scripts = load(contract)["scripts"]
    key = next((k for k in scripts if k == script or k.endswith("/" + script)), None)
    if key is None:
        raise KeyError(f"{script} is not recorded in {contract}")
    return {flag: opt for opt in scripts[key]["options"] for flag in opt["flags"]}


def _type_ok(value: str, typ: str | None) -> bool:
    try:
        if typ == "int":
            int(value)
        elif typ in ("float", "int_or_float", "_int_or_float"):
            float(value)
    except ValueError:
        return False
    return True


def check_argv(contract: str, script: str, argv: list[str]) -> list[str]:
    """Problems with ``argv`` (the options after the script) against the recorded parser."""
    opts = script_options(contract, script)
    problems: list[str] = []
    i = 0
    while i < len(argv):
        flag = argv[i]
        i += 1
        if not flag.startswith("--"):
            problems.append(f"{script}: stray argument {flag!r}")
            continue
        values: list[str] = []
        while i < len(argv) and not argv[i].startswith("--"):
            values.append(argv[i])
            i += 1
        opt = opts.get(flag)
        if opt is None:
            problems.append(f"{script} has no option {flag}")
            continue
        nargs, action = opt["nargs"], opt["action"]
        if action in ("store_true", "store_false", "store_const"):
            if values:
                problems.append(f"{script} {flag} takes no value, got {values}")
            continue
        if nargs in (None, 1) and len(values) != 1:
            problems.append(f"{script} {flag} takes one value, got {len(values)}")
        if nargs == "+" and not values:
            problems.append(f"{script} {flag} takes at least one value")
        for v in values:
            if opt["choices"] and v not in [str(c) for c in opt["choices"] if c is not None]:
                problems.append(f"{script} {flag} {v!r}: allowed {', '.join(str(c) for c in opt['choices'] if c)}")
            elif not _type_ok(v, opt["type"]):
                problems.append(f"{script} {flag} {v!r} is not of type {opt['type']}")
    return problems


# ------------------------------------------------------------------ dataset TOML (kohya scripts)

_TOML_TYPES = {"int": (int,), "float": (float,), "float | int": (float, int), "bool": (bool,), "str": (str,),
               "dict": (dict,), "list[int]": (list,)}


def _value_ok(value: Any, typ: str) -> bool:
    if typ.startswith("int | [int, int]"):
        return (isinstance(value, int) and not isinstance(value, bool)) or (
            isinstance(value, list) and len(value) == 2 and all(isinstance(v, int) for v in value))
    if typ == "list[int]":
        return isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
    want = _TOML_TYPES.get(typ)
    if want is None:
        return True  # a type we do not model: the key's existence is still checked
    if bool in want:
        return isinstance(value, bool)
    if isinstance(value, bool):
        return int in want and typ == "int"  # voluptuous: int keys accept booleans, float keys do not
    return isinstance(value, want)


def check_dataset_toml(contract: str, text: str) -> list[str]:
    """Problems with a dataset TOML against the recorded schema (closed key sets, strict types)."""
    data = tomllib.loads(text)
    dc = load(contract)["dataset_config"]
    if "schema_when_masked_loss_false" in dc:  # sd-scripts
        schema = dc["schema_when_masked_loss_false"]
        levels = {"general": schema["general"], "dataset": schema["dreambooth_dataset"],
                  "subset": schema.get("dreambooth_subset", schema["dreambooth_dataset"])}
    else:  # musubi-tuner: image_dataset / video_dataset by the kind rule
        levels = {"general": dc["general"]}
    problems: list[str] = []
    top = set(data) - {"general", "datasets"}
    if top:
        problems.append(f"unknown top-level table(s): {sorted(top)}")

    def check(table: dict, allowed: dict, where: str) -> None:
        for key, value in table.items():
            if key == "subsets" and where.startswith("datasets"):
                continue
            if key not in allowed:
                problems.append(f"{where}.{key} is not a key the dataset schema accepts")
            elif not _value_ok(value, allowed[key]["type"]):
                problems.append(f"{where}.{key} = {value!r} is not {allowed[key]['type']}")

    check(data.get("general", {}), levels["general"], "general")
    for i, ds in enumerate(data.get("datasets", [])):
        if "dataset" in levels:
            check(ds, levels["dataset"], f"datasets[{i}]")
            for j, sub in enumerate(ds.get("subsets", [])):
                check(sub, levels["subset"], f"datasets[{i}].subsets[{j}]")
        else:
            kind = "video_dataset" if ("video_directory" in ds or "video_jsonl_file" in ds) else "image_dataset"
            check(ds, dc[kind], f"datasets[{i}]({kind})")
    return problems


# ------------------------------------------------------------------ ai-toolkit YAML

_AITK_CLASS_OF = {"model": "ModelConfig", "network": "NetworkConfig", "train": "TrainConfig", "save": "SaveConfig",
                  "sample": "SampleConfig", "logging": "LoggingConfig", "datasets": "DatasetConfig"}


def check_ai_toolkit(cfg: dict[str, Any]) -> list[str]:
    c = load("ai_toolkit.json")
    problems: list[str] = []
    if set(cfg) - {"job", "config", "meta"}:
        problems.append(f"unknown top-level keys {sorted(set(cfg) - {'job', 'config', 'meta'})}")
    if cfg.get("job") not in c["launch"]["job_values"]:
        problems.append(f"job: {cfg.get('job')!r} is not one of {c['launch']['job_values']}")
    process_keys = c["process_keys_sd_trainer_and_diffusion_trainer"]
    classes = c["config_classes"]
    allowed_types = [t["type"] for t in c["file_structure"]["process_type_for_job_extension"]]
    for i, proc in enumerate(cfg.get("config", {}).get("process", [])):
        if proc.get("type") not in allowed_types:
            problems.append(f"process[{i}].type {proc.get('type')!r} is not one of {allowed_types}")
        for key, value in proc.items():
            if key == "type":
                continue
            if key not in process_keys:
                problems.append(f"process[{i}].{key} is not read by the trainer")
                continue
            cls = _AITK_CLASS_OF.get(key)
            if cls is None:
                continue
            fields = classes[cls]["fields"]
            for item in (value if isinstance(value, list) else [value]):
                for k, v in item.items():
                    if k == "samples" and cls == "SampleConfig":
                        item_fields = classes["SampleItem"]["fields"]
                        for s in v:
                            problems += [f"process[{i}].sample.samples[].{sk} is not a SampleItem key"
                                         for sk in s if sk not in item_fields]
                        continue
                    if k not in fields:
                        problems.append(f"process[{i}].{key}.{k} is not read by {cls}")
                    else:
                        problems += _aitk_type(f"process[{i}].{key}.{k}", v, fields[k])
    arch = cfg.get("config", {}).get("process", [{}])[0].get("model", {}).get("arch")
    legacy = [a.split(" ")[0] for a in c["arch"]["legacy_arch_handled_by_ModelConfig"]]
    if arch is not None and arch not in c["arch"]["registered_arch_values"] and arch not in legacy:
        problems.append(f"model.arch {arch!r} is not a registered arch (it would silently fall back to SD)")
    return problems


def _aitk_type(where: str, value: Any, field: dict) -> list[str]:
    ann, default = field.get("annotation"), field.get("default")
    simple = {"int": int, "float": (int, float), "bool": bool, "str": str}
    want = simple.get(ann or "")
    if want is None and isinstance(default, bool):
        want = bool
    if want is None:
        return []
    if want is bool and not isinstance(value, bool):
        return [f"{where} = {value!r} is not a bool"]
    if want is not bool and (isinstance(value, bool) or not isinstance(value, want)):
        # ai-toolkit resolution may be an int or a list of ints (one dataset per resolution)
        if where.endswith(".resolution") and isinstance(value, list) and all(isinstance(v, int) for v in value):
            return []
        return [f"{where} = {value!r} is not {ann}"]
    return []


# ------------------------------------------------------------------ axolotl YAML

def check_axolotl(cfg: dict[str, Any]) -> list[str]:
    """Keys against AxolotlInputConfig's fields, types against its recorded JSON schema."""
    c = load("axolotl.json")
    props = c["json_schema_AxolotlInputConfig"]["properties"]
    problems = [f"{k} is not an axolotl {c['upstream']['pinned_version']} config key" for k in cfg if k not in props]
    for k in c["json_schema_AxolotlInputConfig"].get("required", []):
        if k not in cfg:
            problems.append(f"{k} is required")
    for k, v in cfg.items():
        if k in props and not _json_type_ok(v, props[k], c["json_schema_AxolotlInputConfig"]["$defs"]):
            problems.append(f"{k} = {v!r} does not match the schema")
    return problems


def _json_type_ok(value: Any, sch: dict, defs: dict) -> bool:
    """A small structural check (types, enums, refs); tests run the full jsonschema validation."""
    if "$ref" in sch:
        return _json_type_ok(value, defs[sch["$ref"].rsplit("/", 1)[-1]], defs)
    if "anyOf" in sch:
        return any(_json_type_ok(value, s, defs) for s in sch["anyOf"])
    if "enum" in sch and value not in sch["enum"]:
        return False
    t = sch.get("type")
    checks = {"string": lambda v: isinstance(v, str), "boolean": lambda v: isinstance(v, bool),
              "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
              "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
              "null": lambda v: v is None, "array": lambda v: isinstance(v, list),
              "object": lambda v: isinstance(v, dict)}
    if t is not None and not checks[t](value):
        return False
    if t == "array" and "items" in sch:
        return all(_json_type_ok(v, sch["items"], defs) for v in value)
    if t == "object" and "properties" in sch and sch.get("additionalProperties") is False:
        return all(k in sch["properties"] for k in value)
    return True


# ------------------------------------------------------------------ one entry point

def check_job(trainer, job: TrainerJob) -> None:
    problems: list[str] = []
    for cmd in job.commands:
        if cmd.script:
            idx = next(i for i, a in enumerate(cmd.argv) if a.endswith(cmd.script))
            problems += check_argv(trainer.contract, cmd.script, cmd.argv[idx + 1:])
    for path, text in job.files.items():
        # trackers.toml is accelerate's init_kwargs (--log_tracker_config), not a dataset config:
        # tests/test_trainers_tracking.py starts accelerate's own W&B tracker from it
        if path.endswith(".toml") and not path.endswith("/trackers.toml"):
            problems += check_dataset_toml(trainer.contract, text)
    if job.config is not None:
        if trainer.contract == "ai_toolkit.json":
            problems += check_ai_toolkit(job.config)
        elif trainer.contract == "axolotl.json":
            problems += check_axolotl(job.config)
    _fail(trainer, problems)
