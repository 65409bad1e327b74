"""Dollars per job: phases x $/hour (billed per second), plus storage and bandwidth.

A job on a rented GPU is a sequence of billed phases: boot and install, base-model download,
data upload, caching, training, sampling, then review, pull and destroy. Each phase has a
default estimate (below, and in docs/planner.md) and each can be overridden in the spec under
``compute.phases`` (minutes). Storage is billed by kind (RunPod container disk while running;
Vast.ai storage while the instance exists) and Vast.ai bandwidth per GB at the host's rate.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal

from lorapod.catalog.gpus import GPU, find_gpu
from lorapod.catalog.prices import PriceEntry, load_storage
from lorapod.plan.estimate import Speed, matmul_rate, step_speed
from lorapod.plan.job import DEFAULT_SAMPLE_STEPS, Job
from lorapod.spec import JobSpec

# Defaults, from the guides' SDXL walk-through unless said otherwise.
BOOT_MIN = 10.0  # start from a template and install the trainer
CACHE_STARTUP_MIN = 2.0  # load VAE + text encoders once to cache (assumption)
CACHE_SECONDS_PER_IMAGE_4090 = 1.0  # VAE encode + text encoders per image on an RTX 4090 (assumption)
LLM_LOAD_GB_S = 1.0  # reading weights from the instance's disk into the GPU (assumption)
REVIEW_MIN = 12.0  # look at the samples while the machine still runs (assumption: the guide's 15 min
# covers review, pulling checkpoints and destroying)
DESTROY_MIN = 1.0
HOME_DOWNLOAD_MB_S = 25.0  # pulling checkpoints home (assumption)
# A sampling step (two forwards with CFG, no backward) costs about a third of a training step.
SAMPLE_STEP_FRACTION = 1 / 3
# The quality autopilot (docs/quality.md): its scorer models are downloaded once on the instance
# (openai/clip-vit-base-patch32's model.safetensors, 0.61 GB, and facebook/dinov2-small's, 0.09 GB,
# as the Hub lists them) and loaded in about a quarter of a minute (assumption); each scored image
# is embedded by both in well under a tenth of a second on a GPU (assumption, bench/quality_scoring.py
# measures the CPU).
SCORER_GB = 0.70
SCORER_LOAD_MIN = 0.25
EMBED_S_PER_IMAGE = 0.05
#: scoring prompts when quality.prompts is not given: the trigger in 4 scenes and 2 leakage prompts
#: (quality/prompts.py), or the 2 leakage prompts alone without a trigger
DEFAULT_SCORE_PROMPTS = 6
HOURS_PER_MONTH = 730


@dataclass(frozen=True)
class Phase:
    name: str
    hours: float
    usd: float


def cents(x: float) -> Decimal:
    """Round dollars to the cent, half up (the way a person rounds 0.465 to 0.47)."""
    return Decimal(repr(round(x, 9))).quantize(Decimal("0.01"), rounding=ROUND_HALF_UP)


def phase_minutes(job: Job, gpu: GPU, speed: Speed, boot_min: float = BOOT_MIN) -> list[tuple[str, float]]:
    """Minutes per phase, the spec's ``compute.phases`` overriding the estimates.

    ``boot_min`` is the "boot + install" estimate: :func:`price_job` passes what the ledger
    measured on the offer's provider when it has it."""
    o = job.spec.compute.phases
    storage = load_storage()[1]
    download = job.download_gb * 1e3 / storage["host_download_mb_s"] / 60
    upload = job.upload_gb * 1e3 / storage["home_upload_mb_s"] / 60
    if job.is_image:
        # Scaled from the 4090 by the fitted matmul rate of this model on each GPU (plan/fit.py).
        ref = matmul_rate(job.model, job.settings, find_gpu("RTX 4090"))
        per_image = CACHE_SECONDS_PER_IMAGE_4090 * ref / matmul_rate(job.model, job.settings, gpu)
        cache = CACHE_STARTUP_MIN + job.images * per_image / 60
        sample = job.samples * DEFAULT_SAMPLE_STEPS * speed.seconds_per_step * SAMPLE_STEP_FRACTION / 60
    else:
        cache = 1.0 + job.download_gb / LLM_LOAD_GB_S / 60
        # Generation is memory-bound: every new token reads the weights once.
        weights = job.estimate.parts.get(next(k for k in job.estimate.parts if k.startswith("base weights")), 0)
        per_token = weights * 1024**3 / (gpu.mem_bw_gbs * 1e9)
        sample = job.samples * job.spec.samples.max_new_tokens * per_token / 60
    if job.is_image:
        per_token = 0.0
    train = job.steps * speed.seconds_per_step / 60
    scoring = scoring_minutes(job, speed, sample_s_per_token=None if job.is_image else per_token)
    review = REVIEW_MIN + job.pull_gb * 1e3 / HOME_DOWNLOAD_MB_S / 60 + DESTROY_MIN

    phases: list[tuple[str, float]] = [("boot + install", _pick(o.boot_min, boot_min))]
    if o.prep_min is not None:
        phases.append(("prep (download + upload + cache)", o.prep_min))
    else:
        phases += [
            ("download base model", _pick(o.download_min, download)),
            ("upload data", _pick(o.upload_min, upload)),
            ("cache" if job.is_image else "load + tokenize", _pick(o.cache_min, cache)),
        ]
    phases.append(("train", _pick(o.train_min, train)))
    # A given training time is taken to include its sampling, as in the guides' tables.
    sampling_default = 0.0 if o.train_min is not None else sample
    phases.append(("sampling", _pick(o.sampling_min, sampling_default)))
    # likewise a given training time is taken to include the quality autopilot's scoring
    scoring = _pick(o.scoring_min, 0.0 if o.train_min is not None else scoring)
    if scoring:
        phases.append(("scoring", scoring))
    phases.append(("review + pull + destroy", _pick(o.review_min, review)))
    return phases


def score_prompts(spec: JobSpec) -> int:
    q = spec.quality
    if q.prompts:
        return len(q.prompts)
    return DEFAULT_SCORE_PROMPTS if spec.data.trigger else 2


def scoring_minutes(job: Job, speed: Speed, sample_s_per_token: float | None = None) -> float:
    """Minutes the quality autopilot adds (docs/quality.md), 0 with ``quality.score: off``. Images:
    every checkpoint draws each scoring prompt at each strength (the base once), ``quality.steps``
    sampling steps each at :data:`SAMPLE_STEP_FRACTION` of a training step, then embeds them; plus
    the scorer models' download and load. LLMs: per checkpoint a pass over the held-out rows (as
    long as a training step per row batch, no backward: a third) and ``quality.examples`` greedy
    answers in batches of 16 (each new token reads the weights once per batch)."""
    q = job.spec.quality
    if q.score == "off":
        return 0.0
    ckpts = max(1, job.checkpoints)
    if job.is_image:
        images = score_prompts(job.spec) * (len(q.strengths) * ckpts + 1)
        per_image = q.steps * speed.seconds_per_step * SAMPLE_STEP_FRACTION + EMBED_S_PER_IMAGE
        download = SCORER_GB * 1e3 / load_storage()[1]["host_download_mb_s"] / 60
        return images * per_image / 60 + download + SCORER_LOAD_MIN
    batches = -(-q.examples // 16)
    answers = (ckpts + 1) * batches * q.max_new_tokens * (sample_s_per_token or 0.0)
    val = (ckpts + 1) * (job.spec.eval.max_batches or 4) * speed.seconds_per_step * SAMPLE_STEP_FRACTION
    return (answers + val) / 60


def _pick(override: float | None, default: float) -> float:
    return float(override) if override is not None else default


def price_job(job: Job, price: PriceEntry, speed: Speed | None = None) -> tuple[list[Phase], list[str]]:
    """Phases with dollars for one offer, then storage and bandwidth lines; and warnings."""
    gpu = find_gpu(price.gpu)
    speed = speed or step_speed(job.model, job.step_settings, gpu, job.estimate, spec_settings=job.settings)
    warnings: list[str] = []
    from lorapod.store.phases import measured_boot_min

    measured = measured_boot_min(price.provider)
    if measured is not None and job.spec.compute.phases.boot_min is None:
        warnings.append(f"boot + install on {price.provider}: {measured[0]:.1f} min, the median your ledger "
                        f"measured over {measured[1]} job(s)")
    minutes = phase_minutes(job, gpu, speed, measured[0] if measured else BOOT_MIN)
    rate = price.usd_per_hour
    phases = [Phase(name, m / 60, m / 60 * rate) for name, m in minutes]
    hours = sum(p.hours for p in phases)
    storage = load_storage()[1]
    disk = job.spec.compute.disk_gb
    if price.provider == "runpod":
        per_month = storage["runpod"]["container_disk"]["running"]
        phases.append(Phase(f"storage ({disk:g} GB container disk)", 0.0, disk * per_month / HOURS_PER_MONTH * hours))
    elif price.provider == "vast":
        if price.storage_included:
            phases.append(Phase(f"storage ({disk:g} GB, in the offer's $/h)", 0.0, 0.0))
        elif price.storage_per_gb_month is not None:
            phases.append(Phase(f"storage ({disk:g} GB)", 0.0, disk * price.storage_per_gb_month / HOURS_PER_MONTH * hours))
        if price.download_per_gb is not None or price.upload_per_gb is not None:
            usd = job.download_gb * (price.download_per_gb or 0) + (job.upload_gb * (price.download_per_gb or 0))
            usd += job.pull_gb * (price.upload_per_gb or 0)
            phases.append(Phase("bandwidth", 0.0, usd))
        if price.storage_per_gb_month is None and not price.storage_included:
            warnings.append("Vast.ai storage and bandwidth are billed at the host's rate, not included (use --live)")
    return phases, warnings


def left_running_usd(hours: float, usd_per_hour: float) -> float:
    """What an instance forgotten for ``hours`` costs: the guides' budget killer."""
    return hours * usd_per_hour
