"""The job spec: one YAML file that says what to train, on what data, how, and where.

The same spec drives ``lorapod plan``, ``lorapod train`` and ``lorapod run``, so a job that
worked on a laptop runs unchanged on a rented GPU. Every model forbids unknown keys: a typo
like ``learning_rte`` is an error naming the key and the closest valid one, never a silently
ignored setting.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from lorapod.catalog import families
from lorapod.errors import SpecError

# model.family: "auto", "llm" or a diffusion family of the one family table (catalog/families.py)
Family = Literal[("auto", "llm", *families.NAMES)]  # type: ignore[valid-type]


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class ModelSpec(_Section):
    """The base model: a hub id, a local directory, or a single checkpoint file."""

    id: str = Field(description="Hub id (org/name), a local model directory, or a .safetensors file.")
    revision: str | None = Field(None, description="Hub revision (branch, tag or commit).")
    family: Family = Field("auto", description="Model family; 'auto' reads it from the model.")
    dtype: Literal["auto", "bf16", "fp16", "fp32", "fp8"] = Field(
        "auto",
        description="Dtype of the frozen base weights; auto = bf16 on capable GPUs, fp32 on CPU. "
        "fp8 stores the frozen base in 8 bits (sd-scripts/musubi --fp8_base), halving its VRAM.",
    )
    trust_remote_code: bool = False
    variant: str | None = Field(None, description="Sub-model, e.g. 'dev'/'schnell' for FLUX.1, '4b'/'9b' for FLUX.2 klein.")
    prediction_type: Literal["auto", "epsilon", "v_prediction"] = Field(
        "auto",
        description="SD 1.5/SDXL training target. auto: the model's scheduler config, or for a single "
        ".safetensors file its 'v_pred' key / ss_v_parameterization metadata / catalog name, else epsilon "
        "(said in the plan and the run log). `lorapod train --v-pred` sets v_prediction.",
    )


class MethodSpec(_Section):
    """The adapter: LoRA or QLoRA (4-bit base, CUDA only)."""

    type: Literal["lora", "qlora"] = "lora"
    r: Annotated[int, Field(gt=0, le=1024)] = 16
    alpha: Annotated[float, Field(gt=0)] = 32
    dropout: Annotated[float, Field(ge=0, lt=1)] = 0.05
    target_modules: str | list[str] = Field(
        "all-linear", description="'all-linear' or a list of module names (q_proj, v_proj, ...)."
    )
    rslora: bool = Field(False, description="Rank-stabilised scaling alpha/sqrt(r) instead of alpha/r.")
    train_text_encoder: bool = Field(False, description="Images: also train LoRA on the text encoder(s).")


class DataSpec(_Section):
    """Where the data is and how it becomes training examples."""

    path: str | list[str] = Field(description="Chat JSONL file(s), or an image folder.")
    format: Literal["auto", "messages", "sharegpt", "alpaca", "images", "video"] = "auto"
    val_split: Annotated[float, Field(ge=0, lt=1)] = 0.1
    val_path: str | None = Field(None, description="A separate validation file (overrides val_split).")
    sequence_len: Annotated[int, Field(ge=16)] = 2048
    packing: bool = Field(True, description="Pack several examples per row; attention never crosses them.")
    train_on_assistant_only: bool = Field(True, description="Loss only on assistant turns.")
    skip_bad_examples: bool = Field(
        False, description="Train on the good lines of a chat file that has bad ones (default: refuse and list them)."
    )
    system_prompt: Literal["auto", "keep", "first_user", "last_user"] = Field(
        "auto",
        description="Chat: where a system prompt goes when the model's template cannot keep it (Gemma rejects "
        "one, Mistral v0.3 puts it before the last user turn). auto: keep it where the template can, else fold "
        "it into the first user turn (Gemma) or the last one (Mistral); keep: refuse such conversations.",
    )
    # image datasets
    repeats: Annotated[int, Field(ge=1)] = 1
    resolution: Annotated[int, Field(ge=64)] = 1024
    buckets: bool = Field(True, description="Aspect-ratio buckets instead of a square crop.")
    flip: bool = False
    caption_extension: str = ".txt"
    trigger: str | None = Field(None, description="Trigger word expected first in every caption.")
    shuffle_captions: bool = False
    caption_dropout: Annotated[float, Field(ge=0, le=1)] = 0.0
    cache_latents: bool = True
    cache_text_encoder_outputs: bool = True
    # video datasets (Wan): clips (.mp4/.webm/.mov) and images, which train as 1-frame videos
    target_frames: list[int] = Field(
        [1, 17, 33], description="Video: frame counts of the training windows, each 4n+1 (1 = a single frame)."
    )
    frame_extraction: Literal["head", "uniform", "slide"] = Field(
        "head", description="Video: windows from the clip's start (head), N evenly spaced (uniform), or every "
        "frame_stride frames (slide)."
    )
    frame_sample: Annotated[int, Field(ge=1)] = Field(1, description="Video: windows per clip and target (uniform).")
    frame_stride: Annotated[int, Field(ge=1)] = Field(10, description="Video: frames between window starts (slide).")
    fps: Annotated[float | None, Field(gt=0)] = Field(
        16.0, description="Video: resample clips to this frame rate first (Wan trains at 16 fps); null keeps the source's."
    )
    # the held-out split the quality autopilot scores subject fidelity against (quality/holdout.py)
    holdout: Literal["auto"] | Annotated[int, Field(ge=0, le=1000)] | Annotated[float, Field(gt=0, lt=1)] = Field(
        "auto", description="Images/video: subject images kept out of training, as references the quality autopilot "
        "scores each checkpoint against (never trained on: scores against training images reward copying). auto: "
        "none under 8 subject images (each is needed; said in the run log), else 10% (1 to 8); N images; or a "
        "fraction. LLM runs use val_split / val_path.")
    holdout_path: str | None = Field(
        None, description="Images/video: a folder of reference images of the subject that are not in the training "
        "data (replaces the split: every training image then trains).")

    @model_validator(mode="after")
    def _frames_4n1(self) -> DataSpec:
        bad = [n for n in self.target_frames if n < 1 or (n - 1) % 4]
        if bad or not self.target_frames:
            raise ValueError(f"data.target_frames must be frame counts of the form 4n+1 (1, 5, 9, 17, 33, 81...), "
                             f"not {bad or 'empty'}")
        return self


class StopWhen(_Section):
    """When the quality autopilot ends training early (``train.stop_when``): its score per checkpoint is
    the best over the scored strengths, as a difference from the base model (quality/decide.py)."""

    plateau: Annotated[int | None, Field(ge=1, le=100)] = Field(
        None, description="Stop after this many checkpoints in a row that do not beat the best score so far by more "
        "than its noise (one standard error over prompts, at least 0.002, or min_delta if larger).")
    min_delta: Annotated[float, Field(ge=0)] = Field(
        0.0, description="The smallest score gain that counts as better, on top of the measured noise.")
    target: float | None = Field(None, description="Stop once the best score reaches this (same units as the score).")
    min_checkpoints: Annotated[int, Field(ge=1)] = Field(
        2, description="Never stop before this many checkpoints are scored.")

    @model_validator(mode="after")
    def _some_rule(self) -> StopWhen:
        if self.plateau is None and self.target is None:
            raise ValueError("train.stop_when needs plateau: K (checkpoints without improvement) or target: SCORE")
        return self


class TrainSpec(_Section):
    """Optimisation hyper-parameters."""

    epochs: Annotated[int, Field(ge=1)] = 3
    max_steps: Annotated[int | None, Field(ge=1)] = Field(None, description="Stop after this many optimizer steps.")
    micro_batch_size: Annotated[int, Field(ge=1)] = 1
    grad_accum: Annotated[int, Field(ge=1)] = 1
    optimizer: Literal["adamw", "adamw_8bit"] = "adamw"
    learning_rate: Annotated[float, Field(gt=0, lt=1)] = 2e-4
    scheduler: Literal["cosine", "linear", "constant", "constant_with_warmup"] = "cosine"
    warmup_steps: Annotated[int, Field(ge=0)] = 0
    warmup_ratio: Annotated[float, Field(ge=0, lt=1)] = 0.0
    weight_decay: Annotated[float, Field(ge=0)] = 0.0
    max_grad_norm: Annotated[float | None, Field(gt=0)] = 1.0
    gradient_checkpointing: bool = False
    precision: Literal["auto", "bf16", "fp16", "fp32"] = "auto"
    attention: Literal["auto", "sdpa", "flex", "flash", "eager"] = Field(
        "auto", description="LLM recipe: the attention kernel. auto picks per model (sdpa where the model "
        "supports it, flex_attention or FlashAttention-2 varlen on CUDA where available, eager only for models "
        "without sdpa); packed rows run padding-free, without an L x L mask (docs/llm.md)."
    )
    seed: int = 42
    # image training
    noise_offset: Annotated[float, Field(ge=0)] = 0.0
    min_snr_gamma: Annotated[float | None, Field(gt=0)] = None
    timestep_sampling: Literal["uniform", "logit_normal", "shift"] = "uniform"
    timestep_shift: Annotated[float, Field(gt=0)] = 3.0
    blocks_to_swap: Annotated[int, Field(ge=0)] = Field(
        0, description="Images: transformer blocks kept in CPU RAM and swapped in each step "
        "(sd-scripts/musubi --blocks_to_swap); saves VRAM, costs time."
    )
    experts: Literal["both", "high_noise", "low_noise"] = Field(
        "both", description="Wan2.2: train both experts (each on its own timestep range) or one of them."
    )
    stop_when: StopWhen | None = Field(
        None, description="Stop training when the quality autopilot's score stops getting better: a plateau of K "
        "checkpoints within noise, or a target score (off by default; docs/quality.md). The run then ends normally "
        "at that checkpoint: pulled, destroyed, and the minutes and dollars saved said.")
    parallel: Literal["auto", "ddp", "fsdp"] = Field(
        "auto", description="Several processes, LLM recipe: ddp keeps the whole base on every GPU; fsdp shards "
        "the frozen base over them (FSDP2); auto picks fsdp when the planner's estimate does not fit one GPU "
        "but fits in N shards (docs/scale.md)."
    )


class EvalSpec(_Section):
    every_steps: Annotated[int | None, Field(ge=1)] = Field(None, description="Evaluate every N steps (None: once per epoch).")
    at_start: bool = Field(True, description="Evaluate the base model before training (base vs tuned).")
    max_batches: Annotated[int | None, Field(ge=1)] = None


class SaveSpec(_Section):
    every_steps: Annotated[int | None, Field(ge=1)] = None
    every_epochs: Annotated[int | None, Field(ge=1)] = 1
    keep_last: Annotated[int, Field(ge=1)] = 3


class QualitySpec(_Section):
    """The quality autopilot (docs/quality.md): at every checkpoint, on the machine that trains, images drawn at
    the same seeds by the base and by the checkpoint at each strength are scored against held-out references;
    LLM checkpoints by held-out loss and answers. It picks the checkpoint and strength, and can stop training."""

    score: Literal["auto", "off"] = Field(
        "auto", description="auto: score every checkpoint when a scorer model loads (the run says when none does, "
        "and the autopilot is off); off: no scoring.")
    clip: str | None = Field(
        "openai/clip-vit-base-patch32", description="CLIP or SigLIP model (hub id or local folder): image similarity "
        "to the references and prompt adherence; null: none.")
    dino: str | None = Field(
        "facebook/dinov2-small", description="DINOv2 model (hub id or local folder): subject fidelity and leakage; "
        "null: none.")
    face: Literal["auto", "on", "off"] = Field(
        "auto", description="Face identity (dlib's ResNet descriptor, pip install 'lorapod[faces]'): auto scores it "
        "when faces are found in most held-out references; on requires it.")
    prompts: list[str] | None = Field(
        None, description="Scoring prompts (sd-scripts options allowed). Those with data.trigger test fidelity and "
        "adherence, those without it leakage. Default: the trigger in four new scenes, and two captions of the data "
        "with the trigger taken out.")
    strengths: list[Annotated[float, Field(gt=0, le=2)]] = Field(
        [0.6, 0.8, 1.0], min_length=1, max_length=8, description="LoRA strengths scored at each checkpoint (the base "
        "is strength 0, drawn once).")
    steps: Annotated[int, Field(ge=1, le=200)] = Field(20, description="Sampling steps per scored image.")
    seed: int = Field(1234, description="First seed of the scoring prompts (one seed per prompt, the same at every "
                                        "checkpoint and for the base).")
    examples: Annotated[int, Field(ge=1, le=512)] = Field(
        16, description="LLM: held-out conversations answered (greedy) per checkpoint and by the base.")
    max_new_tokens: Annotated[int, Field(ge=1, le=2048)] = Field(64, description="LLM: longest scored answer.")

    @field_validator("score", "face", mode="before")
    @classmethod
    def _yaml_off(cls, v: Any, info: ValidationInfo) -> Any:
        """YAML 1.1 reads a bare ``off`` as false and ``on`` as true: take them as written."""
        if isinstance(v, bool):
            return "off" if not v else ("on" if info.field_name == "face" else "auto")
        return v


class SamplesSpec(_Section):
    """Samples written while training: prompts (images) or generations (LLMs)."""

    prompts: str | list[str] | None = Field(None, description="Prompts file (sd-scripts syntax) or a list of prompts.")
    every_epochs: Annotated[int | None, Field(ge=1)] = None
    every_steps: Annotated[int | None, Field(ge=1)] = None
    max_new_tokens: Annotated[int, Field(ge=1)] = 64


class PhaseOverrides(_Section):
    """Minutes per job phase, overriding the planner's own estimates."""

    boot_min: Annotated[float | None, Field(ge=0)] = None
    download_min: Annotated[float | None, Field(ge=0)] = None
    upload_min: Annotated[float | None, Field(ge=0)] = None
    cache_min: Annotated[float | None, Field(ge=0)] = None
    prep_min: Annotated[float | None, Field(ge=0)] = Field(None, description="download + upload + cache together.")
    train_min: Annotated[float | None, Field(ge=0)] = None
    sampling_min: Annotated[float | None, Field(ge=0)] = None
    scoring_min: Annotated[float | None, Field(ge=0)] = Field(
        None, description="The quality autopilot's scoring (docs/quality.md); included in train_min when that is given.")
    review_min: Annotated[float | None, Field(ge=0)] = None


class ComputeSpec(_Section):
    """Where the job runs and what it may cost."""

    provider: str = Field("local", description="local | ssh://user@host[:port] | runpod | vast")
    gpu: str | None = Field(None, description="Pin a GPU model, e.g. 'RTX 4090'.")
    max_usd: Annotated[float | None, Field(gt=0)] = None
    max_hours: Annotated[float | None, Field(gt=0)] = None
    hour_worth_usd: Annotated[float, Field(ge=0, le=1000)] = Field(
        1.0, description="What an hour of waiting for the adapter is worth to you, in dollars: the plan (and the "
        "offer `lorapod run` rents) ranks offers by $ per job + this x hours, offers over max_usd / max_hours last; "
        "0 ranks by dollars alone (docs/planner.md, Ranking).")
    usd_per_hour: Annotated[float | None, Field(ge=0)] = Field(
        None, description="What the machine costs, to show dollars so far during local training."
    )
    disk_gb: Annotated[float, Field(gt=0)] = 50
    phases: PhaseOverrides = Field(default_factory=PhaseOverrides)
    image: str | None = Field(None, description="Container image for runpod/vast instances (default: lorapod's "
                              "per provider, see lorapod.catalog.images); the bootstrap installs only what it lacks.")
    gpus: Annotated[int, Field(ge=1, le=64)] = Field(
        1, description="GPUs per instance; above 1 the job trains data-parallel under torchrun (docs/scale.md)."
    )
    nodes: Annotated[int, Field(ge=1, le=64)] = Field(1, description="Machines for one job (SkyPilot backend).")
    cloud: str | None = Field(None, description="SkyPilot infra for --on sky, e.g. aws, gcp, k8s, runpod.")
    volume: str | None = Field(
        None, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$",
        description="RunPod network volume (its name) that keeps the model, environment and latent caches "
        "between sessions; created in a datacenter that has the GPU when none has this name (docs/remote.md).")
    volume_gb: Annotated[int | None, Field(ge=10, le=4000)] = Field(
        None, description="Size of a volume lorapod creates (default: what the model, environment and caches need).")
    spot: Literal["never", "auto", "always"] = Field(
        "never", description="Interruptible (spot) GPUs: never; auto = plan picks spot only when its expected cost at "
        "the worst end of its range still beats on-demand within max_usd and max_hours; always. `lorapod run` rents "
        "the tier chosen (--spot overrides this) and resumes after each preemption (docs/remote.md, Spot).")
    max_bid_per_gpu_hour: Annotated[float | None, Field(gt=0)] = Field(
        None, description="Highest bid per GPU-hour for a spot instance (RunPod bidPerGpu, Vast price); offers whose "
        "minimum bid is above it are not planned on spot.")
    preemptions_per_hour: Annotated[float | None, Field(gt=0, le=60)] = Field(
        None, description="Your prior for spot preemptions per hour (default 0.1, an assumption: providers publish "
        "none); the preemptions your ledger has measured for the provider, GPU and tier update it.")
    spot_checkpoint_min: Annotated[float | None, Field(gt=0)] = Field(
        None, description="Minutes of training between resume checkpoints on spot (default: Young/Daly, "
        "sqrt(2 x checkpoint cost x mean time between preemptions)).")
    spot_save_mb_s: Annotated[float | None, Field(gt=0)] = Field(
        None, description="MB/s of a checkpoint save on your instance, as bench/spot_save.py measures it (default "
        "250, an assumption from a small shared machine): spot is refused on a provider whose SIGTERM-to-SIGKILL window "
        "(RunPod: 5 s) the save on SIGTERM does not fit.")


class WandbSpec(_Section):
    """Weights & Biases: where the run's live metrics and samples go (needs WANDB_API_KEY, or ``wandb login``)."""

    project: str = Field("lorapod", min_length=1, max_length=128, description="W&B project.")
    entity: str | None = Field(None, max_length=128, description="W&B team or user (default: your W&B default).")
    name: str | None = Field(None, max_length=128, description="Run name (default: output.name, the spec's stem).")
    mode: Literal["online", "offline"] | None = Field(
        None, description="offline writes the run files only (``wandb sync`` uploads them later); default: W&B's "
        "own setting (WANDB_MODE), online when none.")


class TrackingSpec(_Section):
    """Live experiment trackers, beside metrics.jsonl (always written). The same names go to lorapod's
    engine and to the external trainers' own tracker settings (docs/tracking.md)."""

    wandb: WandbSpec | None = Field(None, description="Log to Weights & Biases (``wandb: {project: NAME}``).")
    tensorboard: bool = Field(True, description="TensorBoard event files in the run folder's tensorboard/.")
    mlflow: Any = Field(None, description="Not supported: see docs/tracking.md.")

    @model_validator(mode="after")
    def _no_mlflow(self) -> TrackingSpec:
        if self.mlflow is not None:
            raise ValueError("tracking.mlflow is not supported: MLflow's client (mlflow-skinny 3.x) pulls in "
                             "fastapi, uvicorn, databricks-sdk, gitpython and OpenTelemetry on every instance, "
                             "and its file store is deprecated; use tracking.wandb or tracking.tensorboard "
                             "(docs/tracking.md)")
        return self


def apply_report_to(spec: JobSpec, value: str | None) -> JobSpec:
    """``--report-to wandb,tensorboard`` (or ``none``) on top of the spec's ``tracking``.

    wandb turns W&B on with the spec's settings (project ``lorapod`` when it has none); a tracker
    not named is turned off, so ``--report-to none`` leaves only metrics.jsonl."""
    if value is None:
        return spec
    names = {v.strip().lower() for v in value.split(",") if v.strip()}
    unknown = names - {"wandb", "tensorboard", "none"}
    if unknown or not names or ("none" in names and len(names) > 1):
        raise SpecError(f"--report-to {value!r}: name trackers from wandb, tensorboard (comma-separated), or none",
                        hint="e.g. --report-to wandb,tensorboard")
    out = spec.model_copy(deep=True)
    out.tracking.tensorboard = "tensorboard" in names
    if "wandb" not in names:
        out.tracking.wandb = None
    elif out.tracking.wandb is None:
        out.tracking.wandb = WandbSpec()
    return out


class OutputSpec(_Section):
    dir: str = Field("runs", description="Folder that holds one run folder per job.")
    name: str | None = Field(None, description="Job name; default: the spec file's stem.")
    max_pull_gb: Annotated[float | None, Field(gt=0)] = Field(
        None, description="Most GB a remote run brings home (checkpoints, samples); default: 10x the planner's "
                          "estimate + 2 GB. Over it, only the newest checkpoint and the adapter are pulled.")


class JobSpec(_Section):
    """A whole job. ``model`` and ``data`` are required; everything else has a default."""

    model: ModelSpec
    method: MethodSpec = Field(default_factory=MethodSpec)
    data: DataSpec
    train: TrainSpec = Field(default_factory=TrainSpec)
    eval: EvalSpec = Field(default_factory=EvalSpec)
    save: SaveSpec = Field(default_factory=SaveSpec)
    samples: SamplesSpec = Field(default_factory=SamplesSpec)
    quality: QualitySpec = Field(default_factory=QualitySpec)
    compute: ComputeSpec = Field(default_factory=ComputeSpec)
    tracking: TrackingSpec = Field(default_factory=TrackingSpec)
    output: OutputSpec = Field(default_factory=OutputSpec)

    @model_validator(mode="after")
    def _consistent(self) -> JobSpec:
        if self.data.format == "images" and self.model.family == "llm":
            raise ValueError(f"model.family = 'llm' cannot train data.format 'images': set model.family to an "
                             f"image family ({', '.join(families.FAMILIES)}) or auto")
        if self.data.format == "video" and self.model.family not in ("auto", *families.VIDEO):
            raise ValueError(f"model.family = '{self.model.family}' cannot train data.format 'video': set "
                             f"model.family to a video family ({', '.join(families.VIDEO)}) or auto")
        if self.train.attention != "auto" and self.is_image:
            raise ValueError(f"train.attention '{self.train.attention}' is for the LLM recipe; image and video "
                             "models run their trainer's own attention (leave it at auto)")
        return self

    @property
    def is_image(self) -> bool:
        return self.model.family in families.FAMILIES or self.data.format in ("images", "video")

    @property
    def is_video(self) -> bool:
        return self.model.family in families.VIDEO or self.data.format == "video"

    def data_paths(self, base: Path | None = None) -> list[Path]:
        paths = self.data.path if isinstance(self.data.path, list) else [self.data.path]
        return [_resolve(p, base) for p in paths]

    def relocated(self, put: Callable[[str, int], str]) -> JobSpec:
        """A copy of the spec that points at copies of its local inputs, for a machine that is
        not this one. ``put(path, index)`` copies one input (or names where it will be) and
        returns the new path; the indexes keep names apart: the data paths 0..n-1, the validation
        file n, a base model on this disk n+1, a prompts file n+2, the held-out references n+3, the
        quality scorers' model folders on this disk n+4 (CLIP) and n+5 (DINOv2)."""
        out = self.model_copy(deep=True)
        paths = out.data.path if isinstance(out.data.path, list) else [out.data.path]
        new = [put(p, i) for i, p in enumerate(paths)]
        out.data.path = new if isinstance(out.data.path, list) else new[0]
        if out.data.val_path:
            out.data.val_path = put(out.data.val_path, len(paths))
        if Path(out.model.id).exists():
            out.model.id = put(out.model.id, len(paths) + 1)
        if isinstance(out.samples.prompts, str) and Path(out.samples.prompts).is_file():
            out.samples.prompts = put(out.samples.prompts, len(paths) + 2)
        if out.data.holdout_path:
            out.data.holdout_path = put(out.data.holdout_path, len(paths) + 3)
        if out.quality.clip and Path(out.quality.clip).exists():
            out.quality.clip = put(out.quality.clip, len(paths) + 4)
        if out.quality.dino and Path(out.quality.dino).exists():
            out.quality.dino = put(out.quality.dino, len(paths) + 5)
        return out

    def to_yaml(self) -> str:
        """The resolved spec as YAML. The spec holds no secrets by design (keys come from the
        environment), and :func:`redact` is applied anyway as a second line of defence."""
        return yaml.safe_dump(redact(self.model_dump(mode="json")), sort_keys=False)


def _resolve(p: str, base: Path | None) -> Path:
    path = Path(p).expanduser()
    if not path.is_absolute() and base is not None:
        path = base / path
    return path


_SECRET_KEY = re.compile(r"(api[_-]?key|(^|[_-])token$|secret|password)", re.I)  # not max_new_tokens
_SECRET_VALUE = re.compile(r"^(hf_[A-Za-z0-9]{20,}|rpa_[A-Za-z0-9]{20,}|sk-[A-Za-z0-9]{20,})$")


def redact(obj: Any) -> Any:
    """Replace anything that looks like a credential with '<redacted>'."""
    if isinstance(obj, dict):
        return {k: ("<redacted>" if _SECRET_KEY.search(str(k)) and v else redact(v)) for k, v in obj.items()}
    if isinstance(obj, list):
        return [redact(v) for v in obj]
    if isinstance(obj, str) and _SECRET_VALUE.match(obj):
        return "<redacted>"
    return obj


# ----------------------------------------------------------------------------- loading


def parse_override(item: str) -> tuple[list[str], Any]:
    """``train.learning_rate=1e-4`` -> (['train', 'learning_rate'], 0.0001). Values are YAML."""
    if "=" not in item:
        raise SpecError(f"--set {item!r} is not of the form dotted.key=value", hint="e.g. --set train.learning_rate=1e-4")
    key, raw = item.split("=", 1)
    parts = [p for p in key.strip().split(".") if p]
    if not parts:
        raise SpecError(f"--set {item!r} has an empty key")
    try:
        value = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError:
        value = raw
    return parts, value


def apply_overrides(raw: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    for item in overrides:
        parts, value = parse_override(item)
        node = raw
        for p in parts[:-1]:
            child = node.get(p)
            if child is None:
                child = node[p] = {}
            if not isinstance(child, dict):
                raise SpecError(f"--set {item!r}: '{p}' is a value, not a section")
            node = child
        node[parts[-1]] = value
    return raw


def load_spec(path: str | Path | None = None, overrides: list[str] | None = None, raw: dict | None = None) -> JobSpec:
    """Read a spec from YAML (or a dict), apply ``--set`` overrides, validate.

    Relative data paths are resolved against the spec file's folder, so a spec can be run
    from anywhere.
    """
    base: Path | None = None
    if raw is None:
        if path is None:
            raise SpecError("no spec given", hint="pass a spec file, e.g. examples/llm-chat-lora.yaml")
        p = Path(path)
        if not p.is_file():
            raise SpecError(f"spec file {p} does not exist", hint="check the path, or start from examples/")
        try:
            raw = yaml.safe_load(p.read_text(encoding="utf-8")) or {}
        except yaml.YAMLError as exc:
            raise SpecError(f"{p} is not valid YAML: {exc}") from exc
        if not isinstance(raw, dict):
            raise SpecError(f"{p} must hold a mapping (model:, data:, ...), not {type(raw).__name__}")
        base = p.resolve().parent
        raw.setdefault("output", {})
        if isinstance(raw["output"], dict):
            raw["output"].setdefault("name", p.stem)
    raw = apply_overrides(raw, overrides or [])
    spec = validate(raw)
    if base is not None:
        _absolutise(spec, base)
    return spec


def _absolutise(spec: JobSpec, base: Path) -> None:
    d = spec.data
    if isinstance(d.path, list):
        d.path = [str(_resolve(p, base)) for p in d.path]
    else:
        d.path = str(_resolve(d.path, base))
    if d.val_path:
        d.val_path = str(_resolve(d.val_path, base))
    if d.holdout_path:
        d.holdout_path = str(_resolve(d.holdout_path, base))
    q = spec.quality
    for key in ("clip", "dino"):  # a local scorer folder next to the spec; a hub id stays as written
        value = getattr(q, key)
        if value and value.startswith((".", "~")) and _resolve(value, base).exists():
            setattr(q, key, str(_resolve(value, base)))
    if isinstance(spec.samples.prompts, str) and not spec.samples.prompts.strip().startswith("-"):
        cand = _resolve(spec.samples.prompts, base)
        if cand.exists():
            spec.samples.prompts = str(cand)
    mid = spec.model.id
    if mid.startswith((".", "~")) or "/" not in mid.strip("/") or Path(mid).suffix in {".safetensors", ".ckpt"}:
        cand = _resolve(mid, base)
        if cand.exists():
            spec.model.id = str(cand)
    # output.dir stays relative to where the command runs (``runs/`` in the current folder),
    # which is where users look for it.


def validate(raw: dict[str, Any]) -> JobSpec:
    try:
        return JobSpec.model_validate(raw)
    except ValidationError as exc:
        raise SpecError(_explain(exc, raw)) from None


def _explain(exc: ValidationError, raw: dict[str, Any]) -> str:
    lines = [f"the spec has {exc.error_count()} problem(s):"]
    for err in exc.errors():
        loc = [str(x) for x in err["loc"]]
        key = ".".join(loc) or "(top level)"
        value = _lookup(raw, err["loc"])
        if err["type"] == "extra_forbidden":
            section_model = _section_model(loc[:-1])
            known = list(section_model.model_fields) if section_model else []
            close = difflib.get_close_matches(loc[-1], known, n=1)
            hint = f"; did you mean '{'.'.join([*loc[:-1], close[0]])}'?" if close else ""
            lines.append(f"  - unknown key '{key}'{hint} (allowed: {', '.join(known)})")
        elif err["type"] == "missing":
            lines.append(f"  - '{key}' is required")
        elif not loc:  # a check across sections: its message names the fields, the value is the whole spec
            msg = err["msg"].removeprefix("Value error, ")
            lines.append(f"  - {msg}")
        else:
            allowed = _allowed(loc)
            shown = f"{value!r}" if value is not _MISSING else "(not set)"
            extra = f" (allowed: {allowed})" if allowed else ""
            lines.append(f"  - {key} = {shown}: {err['msg']}{extra}")
    return "\n".join(lines)


_MISSING = object()


def _lookup(raw: Any, loc: tuple) -> Any:
    node = raw
    for part in loc:
        if (isinstance(node, dict) and part in node) or (isinstance(node, list) and isinstance(part, int) and part < len(node)):
            node = node[part]
        else:
            return _MISSING
    return node


def _section_model(loc: list[str]) -> type[BaseModel] | None:
    model: type[BaseModel] = JobSpec
    for part in loc:
        field = model.model_fields.get(part)
        if field is None:
            return None
        ann = field.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            model = ann
        else:
            return None
    return model


def _allowed(loc: list[str]) -> str | None:
    model = _section_model(loc[:-1])
    if model is None or not loc:
        return None
    field = model.model_fields.get(loc[-1])
    if field is None:
        return None
    args = getattr(field.annotation, "__args__", ())
    if getattr(field.annotation, "__origin__", None) is Literal:
        return " | ".join(map(str, args))
    lits = [a for a in args if getattr(a, "__origin__", None) is Literal]
    if lits:
        return " | ".join(str(x) for lit in lits for x in lit.__args__)
    return None


def prompts_of(spec: JobSpec) -> list[str]:
    """The sample prompts as lines (a prompts file is read when it is here; else None)."""
    p = spec.samples.prompts
    if p is None:
        return []
    if isinstance(p, list):
        return [str(x) for x in p]
    path = Path(p)
    if path.is_file():
        return [ln.strip() for ln in path.read_text(encoding="utf-8").splitlines()
                if ln.strip() and not ln.lstrip().startswith("#")]
    return [p]
