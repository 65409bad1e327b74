"""The spec's tracking as each external trainer's own settings, judged by the code that reads them.

sd-scripts/musubi-tuner hand ``--log_tracker_name`` and the ``--log_tracker_config`` TOML to
accelerate's ``init_trackers`` (sd-scripts library/train_util.py:6589: ``init_kwargs =
toml.load(args.log_tracker_config)``); here accelerate's own WandBTracker starts a real W&B run
(offline) from exactly those values, and W&B's reader says which project, entity and name it got.
"""

from __future__ import annotations

import tomllib

import pytest
import yaml

from lorapod.trainers import get, prepare
from lorapod.trainers.base import Layout
from lorapod.trainers.contracts import check_argv, load

from .test_engine_trackers import wandb_offline, wandb_records  # noqa: F401  (the fixture is used by name)
from .test_trainers_golden import example

TRACKING = {"wandb": {"project": "mugs", "entity": "team-a", "name": "mug-v1"}, "tensorboard": True}


def _job(ex, trainer, tmp_path, tracking=TRACKING):
    spec = example(ex, tmp_path)
    spec = spec.model_copy(update={"tracking": type(spec.tracking).model_validate(tracking)})
    return spec, *prepare(spec, trainer, Layout("/w"))


def _option(argv, name):
    return argv[argv.index(name) + 1]


@pytest.mark.parametrize(("ex", "trainer"), [("sdxl-object-lora", "sd-scripts"), ("wan21-video-lora", "musubi-tuner")])
def test_kohya_trainers_get_the_same_wandb_names(ex, trainer, tmp_path):
    _spec, t, job = _job(ex, trainer, tmp_path)
    cmd = [c for c in job.commands if c.script][-1]
    at = next(i for i, a in enumerate(cmd.argv) if a.endswith(cmd.script))
    args = cmd.argv[at + 1:]
    assert check_argv(t.contract, cmd.script, args) == []
    assert _option(args, "--log_with") == "all"  # tensorboard and wandb
    assert _option(args, "--log_tracker_name") == "mugs"
    toml_path = _option(args, "--log_tracker_config")
    init_kwargs = tomllib.loads(job.files[toml_path])
    assert init_kwargs == {"wandb": {"name": "mug-v1", "entity": "team-a"}}


def test_accelerate_starts_the_wandb_run_kohya_would(tmp_path):
    """What sd-scripts' init_trackers does with our values, through accelerate's own tracker."""
    pytest.importorskip("wandb")
    accelerate = pytest.importorskip("accelerate")
    _spec, _t, job = _job("sdxl-object-lora", "sd-scripts", tmp_path)
    args = [c for c in job.commands if c.script][-1].argv
    init_kwargs = tomllib.loads(job.files[_option(args, "--log_tracker_config")])
    init_kwargs["wandb"]["dir"] = str(tmp_path)  # where the run files go (sd-scripts: the cwd)
    acc = accelerate.Accelerator(log_with="wandb", project_dir=str(tmp_path))
    acc.init_trackers(_option(args, "--log_tracker_name"), config={"lr": 1e-4}, init_kwargs=init_kwargs)
    acc.log({"loss": 0.5}, step=1)
    acc.end_training()
    meta = next(r["run"] for r in wandb_records(tmp_path) if r["type"] == "run")
    assert (meta["project"], meta["entity"], meta["display_name"]) == ("mugs", "team-a", "mug-v1")


def test_tensorboard_only_is_unchanged_and_none_logs_nothing(tmp_path):
    _s, _t, job = _job("sdxl-object-lora", "sd-scripts", tmp_path, {"tensorboard": True})
    args = [c for c in job.commands if c.script][-1].argv
    assert _option(args, "--log_with") == "tensorboard" and "--log_tracker_config" not in args
    (tmp_path / "b").mkdir()
    _s, _t, job = _job("sdxl-object-lora", "sd-scripts", tmp_path / "b", {"tensorboard": False})
    assert "--log_with" not in [c for c in job.commands if c.script][-1].argv


def test_axolotl_gets_its_wandb_fields(tmp_path):
    jsonschema = pytest.importorskip("jsonschema")
    _spec, _t, job = _job("llm-chat-lora", "axolotl", tmp_path)
    cfg = yaml.safe_load(next(iter(job.files.values())))
    assert {k: cfg[k] for k in ("wandb_project", "wandb_entity", "wandb_name", "use_tensorboard")} == {
        "wandb_project": "mugs", "wandb_entity": "team-a", "wandb_name": "mug-v1", "use_tensorboard": True}
    jsonschema.validate(cfg, load("axolotl.json")["json_schema_AxolotlInputConfig"])


def test_ai_toolkit_keeps_its_ui_logger_and_lorapod_forwards(tmp_path):
    spec, _t, job = _job("flux2-klein-lora", "ai-toolkit", tmp_path)
    logging = job.config["config"]["process"][0]["logging"]
    assert logging.get("use_ui_logger") is True and not logging.get("use_wandb")  # loss_log.db stays
    assert get("ai-toolkit").forwarded(spec) == ["wandb"]
    assert get("sd-scripts").forwarded(spec) == []
