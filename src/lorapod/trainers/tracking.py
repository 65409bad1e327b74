"""The spec's ``tracking`` as each external trainer's own tracker settings, with the same names.

The W&B project, entity and run name are those lorapod's engine uses (the run name defaults to
``output.name``), so runs of one spec land side by side whichever trainer ran them:

- sd-scripts and musubi-tuner: ``--log_with`` (tensorboard | wandb | all), ``--log_tracker_name``
  as the W&B project and ``--log_tracker_config`` for the rest. Their ``init_trackers``
  (sd-scripts library/train_util.py:6589, musubi-tuner hv_train_network.py) pass the TOML's
  ``[wandb]`` table to accelerate's ``WandBTracker``, whose ``wandb.init(project=..., **kwargs)``
  takes ``entity``, ``name`` and ``mode``; the file *replaces* ``--wandb_run_name``, so the name goes in
  it too. accelerate's ``all`` is every tracker it finds installed (tensorboard and wandb here).
- axolotl: ``wandb_project``, ``wandb_entity``, ``wandb_name``, ``wandb_mode`` and ``use_tensorboard``
  (its WandbConfig and HyperparametersConfig fields in the recorded schema).
- ai-toolkit (27a03a91, toolkit/logging_aitk.py ``create_logger``) keeps one logger: with
  ``logging.use_wandb`` it returns the WandbLogger *instead of* the UI logger, so ``loss_log.db``,
  which lorapod reads for the metrics, the stall watch and the dollars, would no longer be written.
  lorapod therefore leaves ai-toolkit's logging as it is and its trainer wrapper sends the bridged
  metrics to the spec's trackers itself (:data:`FORWARDED`), under the engine's names.
"""

from __future__ import annotations

from lorapod.trainers import tomlw

# the spec's trackers that lorapod's trainer wrapper feeds from metrics.jsonl, per trainer
# (those the trainer cannot log to itself without losing what lorapod reads)
FORWARDED = {"ai-toolkit": ("wandb",)}


def run_name(spec) -> str:
    w = spec.tracking.wandb
    return (w.name if w is not None and w.name else None) or spec.output.name or "lora"


def kohya_args(spec, layout, files: dict[str, str]) -> list[str]:
    """sd-scripts / musubi-tuner options (and the tracker TOML, added to ``files``)."""
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


def axolotl_fields(spec) -> dict:
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


def forwarded(spec, trainer_name: str) -> list[str]:
    """The trackers the wrapper opens for this trainer's bridged metrics."""
    wanted = ["wandb"] if spec.tracking.wandb is not None else []
    return [n for n in wanted if n in FORWARDED.get(trainer_name, ())]
