"""The image LoRA engine: SD 1.5, SDXL, FLUX.1 and FLUX.2 klein on diffusers + peft.

``train_diffusion`` reads top to bottom: refuse a base model of the wrong family (before any
work), read the image folder, load the pipeline, cache latents and text-encoder outputs to disk,
free the encoders, attach LoRA, then hand a ``DiffusionRecipe`` to the shared training loop.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path

import torch

from lorapod.catalog.families import VIDEO, facts
from lorapod.data.findings import Finding
from lorapod.engine import distributed
from lorapod.engine.autopilot import ImagePlan, hold_out, image_autopilot, image_prompts, plan_image
from lorapod.engine.checkpoint import resume_point
from lorapod.engine.device import Precision, pick_device, resolve_precision
from lorapod.engine.diffusion import cache as dcache
from lorapod.engine.diffusion import dataset, memory
from lorapod.engine.diffusion import samples as smp
from lorapod.engine.diffusion.families import Components, resolve_family
from lorapod.engine.diffusion.fp8 import store_fp8
from lorapod.engine.diffusion.lora import attach_lora, lora_config
from lorapod.engine.diffusion.precision import outside_autocast, refuse_fp16
from lorapod.engine.diffusion.quiet import quiet
from lorapod.engine.diffusion.recipe import DiffusionRecipe, describe
from lorapod.engine.loop import FitResult, fit
from lorapod.errors import LorapodError, SpecError
from lorapod.rundir import RunDir
from lorapod.spec import JobSpec


@dataclass
class DiffusionRun:
    run: RunDir
    result: FitResult
    recipe: DiffusionRecipe
    findings: list[Finding] = field(default_factory=list)
    cache_hits: int = 0
    cache_misses: int = 0


def _freeze(c: Components) -> None:
    for m in [c.denoiser, c.vae, *c.text_encoders]:
        if m is not None:
            m.requires_grad_(False)
            m.eval()


def set_prediction_type(spec: JobSpec, comps: Components, run: RunDir, log=print) -> str:
    """Decide epsilon vs v-prediction (``lorapod.prediction_type``) and write it into the scheduler
    config, which the training target, the sampling pipeline and the export metadata all read."""
    from lorapod import prediction_type as pt

    found = comps.scheduler.config.get("prediction_type", "epsilon")
    pred, why, defaulted = pt.resolve(spec.model.id, comps.family, spec.model.prediction_type, found)
    if comps.family.flow:
        return pred
    if pred != found:
        comps.scheduler.register_to_config(prediction_type=pred)
    if defaulted:
        log(f"[warning] {pt.loud_default(spec.model.id)}")
        run.event(f"prediction type: epsilon by default ({pt.DEFAULTED})")
    else:
        log(f"prediction type: {pred} ({why})")
        run.event(f"prediction type: {pred} ({why})")
    return pred


def prepare(spec: JobSpec, run: RunDir, device: str | None = None, log=print,
            cache_root: Path | None = None, quality: ImagePlan | None = None,
            ) -> tuple[DiffusionRecipe, list[Finding], dcache.DiskCache | None]:
    """Everything before the first step: checks, data, model, caches, LoRA. No training yet.
    ``quality``: the autopilot's plan (images are held out only when something scores them)."""
    quiet()
    torch.manual_seed(spec.train.seed)
    random.seed(spec.train.seed)
    precision: Precision = resolve_precision(spec.train.precision, spec.model.dtype, pick_device(device))
    family = resolve_family(spec.model.family, spec.model.id, spec.model.revision)
    m, d = spec.method, spec.data
    if m.type != "lora":
        raise SpecError(f"method.type {m.type} is for LLMs; image LoRAs use method.type: lora")
    refuse_fp16(family, precision)
    swap_n = spec.train.blocks_to_swap or 0
    if swap_n and not family.block_lists:
        raise SpecError(f"train.blocks_to_swap: {family.name}'s U-Net has no transformer blocks to swap",
                        hint="remove train.blocks_to_swap (block swap is for the diffusion transformers)")
    if m.train_text_encoder and not family.kohya_te_prefixes:
        raise SpecError(f"method.train_text_encoder is not supported for {family.name} (its text encoder is an LLM)",
                        hint="set method.train_text_encoder: false")

    items, findings = dataset.scan(spec.data_paths(), d.resolution, d.buckets, d.caption_extension, d.repeats, d.trigger)
    for f in findings:
        log(f"[{f.severity}] {f.path}: {f.message}")
        run.event(f"data {f.severity} {f.code}: {f.path}")
    # the quality autopilot's references never train
    items, held = hold_out(spec, run, items, log, quality is not None and quality.holds_out)

    # model.dtype fp8 (resolve_precision has checked the GPU): load in the compute dtype, then
    # store the transformer blocks' linear weights in float8
    fp8 = precision.weights == torch.float8_e4m3fn
    comps = family.load(spec.model.id, spec.model.revision, precision.autocast_dtype if fp8 else precision.weights)
    _freeze(comps)
    set_prediction_type(spec, comps, run, log)
    if fp8:
        n = (memory.store_fp8(comps.denoiser, family.block_lists) if family.block_lists
             else store_fp8(comps.denoiser))
        log(f"fp8: {n} linear layers of the {family.denoiser_name} stored in float8")
    if swap_n and swap_n >= len(family.blocks(comps.denoiser)):
        raise SpecError(f"train.blocks_to_swap {swap_n} >= the model's {len(family.blocks(comps.denoiser))} blocks",
                        hint=f"at most {len(family.blocks(comps.denoiser)) - 1}")
    dev = precision.device
    if precision.weights == torch.float16:
        comps.vae.to(torch.float32)  # SD/SDXL VAEs overflow to NaN in fp16 (sd-scripts' --no_half_vae)
    outside_autocast(comps.vae, comps.text_encoders)
    # only the encoders visit the GPU while caching; the denoiser stays in CPU RAM until they have
    # left (FLUX.1: 22 GiB of transformer and 9 GiB of CLIP + T5 do not share a 24 GB card)
    comps.vae.to(dev)
    for te in comps.text_encoders:
        te.to(dev)

    cache_te = d.cache_text_encoder_outputs and not m.train_text_encoder
    if cache_te and (d.shuffle_captions or d.caption_dropout):
        log("[warning] caption shuffle/dropout is off: text-encoder outputs are cached "
            "(set data.cache_text_encoder_outputs: false to use them)")
        run.event("caption shuffle/dropout disabled by cached text-encoder outputs")
    live = not cache_te

    disk = dcache.DiskCache(cache_root or dcache.default_cache_root(), comps.identity)
    flips = (False, True) if d.flip else (False,)
    keys = {(i, f): disk.latent_path(it.digest, it.bucket, f) for i, it in enumerate(items) for f in flips}
    by_path = {v: k for k, v in keys.items()}

    @torch.no_grad()
    def encode_images(paths: list[Path]) -> list[dict[str, torch.Tensor]]:
        out = []
        for p in paths:  # one at a time: buckets differ in size
            i, f = by_path[p]
            px = dataset.load_pixels(items[i], f).unsqueeze(0).to(dev)
            with precision.autocast():
                z = family.encode_latents(comps, px)
            out.append({"latents": z[0].float()})
        return out

    if d.cache_latents:
        got = disk.get_many(keys.values(), encode_images)
        latents = {k: got[p]["latents"] for k, p in keys.items()}
    else:  # encoded once for this run, kept in memory only
        latents = {k: encode_images([p])[0]["latents"] for k, p in keys.items()}
    log(f"latents: {len(latents)} ({disk.hits} from the cache, {disk.misses} encoded)")
    run.event(f"latents: {len(latents)} ({disk.hits} from the cache in {disk.root}, {disk.misses} encoded)")

    prompts = smp.load_prompts(spec.samples.prompts, d.resolution, d.resolution, spec.train.seed,
                               family.default_sample_steps(comps), facts(family.name).guidance)
    # the quality autopilot draws at quality.steps, or fewer for a model distilled for fewer (schnell: 4)
    distilled = family.default_sample_steps(comps)
    scoring = image_prompts(spec, [it.caption for it in items], facts(family.name).guidance,
                            distilled if distilled < family.sample_steps else None)

    @torch.no_grad()
    def encode_captions(caps: list[str]) -> list[dict[str, torch.Tensor]]:
        with precision.autocast():
            enc = family.encode_text(comps, caps, dev)
        return [{k: v[j].float() for k, v in enc.items()} for j in range(len(caps))]

    text = None
    sample_text: dict[str, dict[str, torch.Tensor]] = {}
    if cache_te:
        text = disk.texts((it.caption for it in items), encode_captions)
        wanted = sorted({p.prompt for p in prompts} | {p.negative for p in prompts}
                        | {p.prompt for p in scoring} | {p.negative for p in scoring})
        if wanted:
            sample_text = dict(zip(wanted, encode_captions(wanted), strict=True))
        for te in comps.text_encoders:  # not needed on the GPU any more
            te.to("cpu")
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    if not swap_n:
        comps.denoiser.to(dev)

    targets = family.default_targets if m.target_modules == "all-linear" else m.target_modules
    # The adapter's initial weights from the seed alone, whatever loading the model, the data and
    # the caches did to the global RNG before (as in the LLM engine, where building the built-in
    # model did): a restart from step 0 then starts exactly as a fresh run.
    torch.manual_seed(spec.train.seed)
    random.seed(spec.train.seed)
    attach_lora(comps.denoiser, lora_config(spec, targets))
    if m.train_text_encoder:
        for te in comps.text_encoders:
            attach_lora(te, lora_config(spec, family.te_targets))
    swap = None
    if swap_n:  # block swap (N5): the last blocks' frozen weights stay in CPU RAM, with its own checkpointing
        blocks = family.blocks(comps.denoiser)
        if dev.type == "cuda":
            memory.host_ram_check(memory.pinned_bytes(blocks, swap_n), f"block swap of {swap_n} blocks")
        swap = memory.swap_blocks(comps.denoiser, swap_n, dev, blocks=blocks)
        memory.place(comps.denoiser, dev, swap)
        log(f"block swap: the frozen weights of {swap_n} of {len(blocks)} blocks stay in CPU RAM "
            f"({swap.pinned / 1024**3:.2f} GiB{' pinned' if dev.type == 'cuda' else ', no effect on CPU'})")
        run.event(f"block swap: {swap_n} of {len(blocks)} blocks in CPU RAM")
    recipe = DiffusionRecipe(spec, run, precision, comps, items, latents, text, prompts, sample_text, live)
    recipe.score_prompts, recipe.holdout = scoring, held
    recipe.swap = swap
    if swap is None and spec.train.gradient_checkpointing:
        comps.denoiser.enable_gradient_checkpointing()
        if m.train_text_encoder:
            for te in comps.text_encoders:
                te.gradient_checkpointing_enable()
    info = describe(items)
    log(f"data: {info['images']} images, {info['samples_per_epoch']} samples per epoch (repeats), "
        f"buckets {info['buckets']}")
    return recipe, findings, disk


def is_video(spec: JobSpec) -> bool:
    """A video job: by the spec's family or data format, or (family auto) by the model's own index."""
    if spec.is_video:
        return True
    if spec.model.family != "auto":
        return False
    from lorapod.engine.diffusion.families import detect

    return detect(spec.model.id, spec.model.revision)[0] in VIDEO


class _Quiet(RunDir):
    """The run folder as processes other than rank 0 see it: events go nowhere."""

    def event(self, message: str) -> None:
        return None


def train_diffusion(spec: JobSpec, run: RunDir, *, resume: bool = False, device: str | None = None,
                    on_step=None, show_progress: bool | None = None, log=print,
                    cache_root: Path | None = None) -> DiffusionRun:
    world, device = distributed.init(device)
    log = world.only_main(log)
    prep = prepare
    if is_video(spec):  # a video family: clips and images as windows of frames (engine/diffusion/video.py)
        if world.active:
            raise LorapodError("video training runs in one process for now",
                               hint="drop --processes / set compute.gpus: 1; block swap fits 14B on one card")
        from lorapod.engine.diffusion.video import prepare_video as prep
    plan = plan_image(spec, world, log)  # before the data: images are held out only when scored
    with world.main_first():  # rank 0 fills the latent / text caches; the others then read them
        recipe, findings, disk = prep(spec, run if world.is_main else _Quiet(run.root), device, log, cache_root,
                                      quality=plan)
    trainable = sum(p.numel() for p in recipe.trainable_parameters())
    log(f"model {spec.model.id} ({recipe.family.name}, {recipe.prediction}): {trainable:,} LoRA parameters "
        f"on {recipe.precision.device} ({recipe.precision.compute})")
    event = world.only_main(run.event)
    event(f"training {spec.model.id} ({recipe.family.name}) on {recipe.precision.device}"
          + (f", {world.size} processes" if world.active else ""))
    checkpoint = resume_point(run.checkpoints, event, log) if resume and world.is_main else None

    def step_hook(state, loss):
        recipe.on_step(state)
        if on_step is not None:
            on_step(state, loss)

    autopilot = image_autopilot(spec, run, recipe, plan, recipe.precision.device, log,
                                getattr(recipe, "reference_frames", None))
    result = fit(recipe, spec, run, recipe.precision, resume=checkpoint, on_step=step_hook, show_progress=show_progress,
                 judge=autopilot)
    return DiffusionRun(run, result, recipe, findings, disk.hits if disk else 0, disk.misses if disk else 0)

