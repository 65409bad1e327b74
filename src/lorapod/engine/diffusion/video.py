"""Video LoRAs through the image engine's loop, caches, checkpoints and exports, for any video family
(``engine/diffusion/families/``: Wan2.1 / Wan2.2 today); what differs by family is asked of the family
(its blocks, text length, experts, VAE factors, sample frame rate, pipeline), the memory savers are
``engine/diffusion/memory.py``.

``prepare_video`` reads top to bottom like the image ``prepare``, in the order a 24 GB GPU needs:
refuse a wrong model or a job that cannot fit (before any weight loads), cut the clips into
windows, load the pipeline on the CPU, cache umT5 outputs and VAE latents with only the encoders on
the GPU, send the encoders back, then put the transformer(s) on the GPU with fp8 storage and block
swap, attach LoRA and hand a ``VideoRecipe`` to the shared loop.

``VideoRecipe`` is the image ``DiffusionRecipe`` with 5-D latents (B, C, frames, h, w), umT5 states
padded at batch time, Wan2.2's two experts each trained on its own noise range, samples written as
MP4 clips plus a contact sheet, and files in the diffusers and ComfyUI (``lora_unet_``) layouts.
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from lorapod.catalog import families
from lorapod.data.findings import Finding
from lorapod.engine.autopilot import hold_out, image_prompts
from lorapod.engine.checkpoint import TrainState
from lorapod.engine.device import Precision, pick_device, resolve_precision
from lorapod.engine.diffusion import cache as dcache
from lorapod.engine.diffusion import memory
from lorapod.engine.diffusion import samples as smp
from lorapod.engine.diffusion import video_data as vd
from lorapod.engine.diffusion.families import Components, resolve_family
from lorapod.engine.diffusion.lora import attach_lora, lora_config
from lorapod.engine.diffusion.precision import outside_autocast, refuse_fp16
from lorapod.engine.diffusion.quiet import quiet
from lorapod.engine.diffusion.recipe import Batch, DiffusionRecipe, sample_sigmas
from lorapod.errors import SpecError
from lorapod.export import kohya
from lorapod.plan.vram import GiB
from lorapod.rundir import RunDir
from lorapod.spec import JobSpec

DEFAULT_STEPS = 30
DEFAULT_FRAMES = 33
#: the longest clip the quality autopilot draws to score a checkpoint (first, middle, last frame)
SCORE_FRAMES = 9
_FRAMES_OPT = re.compile(r"\s--f\s+(\S+)")
_IMAGE_OPT = re.compile(r"\s--i\s+(\S+)")


@dataclass(frozen=True)
class VideoPrompt:
    prompt: smp.SamplePrompt
    frames: int
    image: str | None = None  # I2V: the start image (--i)


def load_video_prompts(source, width: int, height: int, seed: int, guidance: float | None = None) -> list[VideoPrompt]:
    """sd-scripts prompt lines plus musubi-tuner's ``--f FRAMES`` (4n+1) and ``--i IMAGE`` (I2V start frame);
    ``guidance``: the family's default (the catalog's first video family's when not given)."""
    if guidance is None:
        guidance = families.facts(families.VIDEO[0]).guidance
    if not source:
        return []
    lines = source if isinstance(source, list) else None
    if lines is None:
        p = Path(str(source)).expanduser()
        lines = p.read_text(encoding="utf-8-sig").splitlines() if p.is_file() else [str(source)]
    out = []
    for line in lines:
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        frames = DEFAULT_FRAMES
        m = _FRAMES_OPT.search(" " + line)
        if m:
            try:
                frames = int(m.group(1))
            except ValueError:
                raise SpecError(f"sample prompt {line.strip()!r}: --f takes a frame count", hint="e.g. --f 33") from None
            if frames < 1 or (frames - 1) % 4:
                raise SpecError(f"sample prompt {line.strip()!r}: --f {frames} is not of the form 4n+1",
                                hint="use 1, 5, 9, 17, 33, 49, 81 ...")
            line = _FRAMES_OPT.sub("", " " + line).strip()
        m = _IMAGE_OPT.search(" " + line)
        image = m.group(1) if m else None
        if image and not Path(image).expanduser().is_file():
            raise SpecError(f"sample prompt {line.strip()!r}: start image {image} does not exist", hint="fix the --i path")
        line = _IMAGE_OPT.sub("", " " + line).strip()
        sp = smp.parse_line(line, width, height, seed, DEFAULT_STEPS, guidance)
        out.append(VideoPrompt(sp, frames, image))
    return out


def predicted_cache_bytes(items: list[vd.VideoItem], z_dim: int, text_dim: int, flips: int,
                          text_tokens: int = 512, spatial: int = 8) -> dict[str, int]:
    """What the caches will hold, from the windows' buckets and the model's sizes alone (fp32
    latents of z_dim x (1 + (F-1)/4) x H/s x W/s per window and flip, s the VAE's spatial factor;
    at most ``text_tokens`` umT5 states per distinct caption). Tensor bytes: each file adds a
    safetensors header of ~100 bytes. The run reports it next to the bytes actually written."""
    latents = sum(z_dim * ((f - 1) // 4 + 1) * (h // spatial) * (w // spatial) * 4 for f, w, h in
                  {(it.digest, it.window_key, it.bucket): it.bucket for it in items}.values()) * flips
    captions = len({it.caption for it in items})
    return {"latents": latents, "text_max": captions * text_tokens * text_dim * 4}


def report_cache_size(run: RunDir, items: list[vd.VideoItem], comps: Components, latent_files: list[Path],
                      text_files: list[Path], flips: int, spatial: int, log=print) -> dict:
    """``cache.json`` in the run folder and one log line: predicted against written bytes."""
    z_dim = comps.family.latent_channels(comps)
    cfg = comps.text_encoders[0].config
    text_dim = int(getattr(cfg, "d_model", None) or getattr(cfg, "hidden_size", 4096))
    pred = predicted_cache_bytes(items, z_dim, text_dim, flips, comps.family.text_len(comps), spatial)
    if comps.extra.get("i2v"):  # + the mask and first-frame latents (z + 4 channels), + CLIP image states (2.1)
        pred["latents"] = pred["latents"] * (2 * z_dim + 4) // z_dim
        enc = comps.extra.get("image_encoder")
        if enc is not None:
            ec = enc.config
            pred["latents"] += len(latent_files) * ((ec.image_size // ec.patch_size) ** 2 + 1) * ec.hidden_size * 4
    actual = {"latents": _bytes(latent_files), "text": _bytes(text_files)}
    report = {"predicted_bytes": pred, "actual_bytes": actual, "windows": len(items)}
    (run.root / "cache.json").write_text(json.dumps(report, indent=2), encoding="utf-8")
    log(f"cache: latents {actual['latents'] / 1e6:.2f} MB (predicted {pred['latents'] / 1e6:.2f} MB), "
        f"text {actual['text'] / 1e6:.2f} MB (at most {pred['text_max'] / 1e6:.2f} MB predicted)")
    return report


def _bytes(paths) -> int:
    return sum(p.stat().st_size for p in paths if p.is_file())


def idle_swap_count(blocks: list[torch.nn.Module], tr: torch.nn.Module, device: torch.device) -> int:
    """How many of an idle Wan2.2 expert's blocks to keep in CPU RAM while it samples: on CUDA as
    few as leave half of the free memory for sampling with the rest resident (the trained expert
    is on the card already: a whole 14B expert does not fit beside it on 24 GB); elsewhere all
    but one, which changes nothing there but runs the same path."""
    n = len(blocks)
    if device.type != "cuda":
        return n - 1
    free, _ = torch.cuda.mem_get_info(device)
    per_block = max(sum(p.numel() * p.element_size() for p in b.parameters()) for b in blocks)
    rest = sum(p.numel() * p.element_size() for p in tr.parameters()) - per_block * n
    fit = int((free / 2 - rest) // per_block) if per_block else n
    return min(n, max(0, n - fit))


def prepare_video(spec: JobSpec, run: RunDir, device: str | None = None, log=print,
                  cache_root: Path | None = None, quality=None) -> tuple[VideoRecipe, list[Finding], dcache.DiskCache]:
    """``quality``: the autopilot's plan (engine/autopilot.py: clips are held out only when scored)."""
    quiet()
    torch.manual_seed(spec.train.seed)
    random.seed(spec.train.seed)
    dev_req = pick_device(device)
    precision: Precision = resolve_precision(spec.train.precision, spec.model.dtype, dev_req)
    family = resolve_family(spec.model.family, spec.model.id, spec.model.revision)
    if not getattr(family, "video", False):
        raise SpecError(f"{spec.model.id} is a {family.name} model, not a video model",
                        hint=f"use a model of a video family ({', '.join(families.VIDEO)}; diffusers layout)")
    refuse_fp16(family, precision)
    m, d, t = spec.method, spec.data, spec.train
    if m.type != "lora":
        raise SpecError(f"method.type {m.type} is for LLMs; video LoRAs use method.type: lora")
    if m.train_text_encoder:
        raise SpecError(f"method.train_text_encoder is not supported for {family.name} video LoRAs",
                        hint="set method.train_text_encoder: false")

    rule = vd.FrameRule(tuple(d.target_frames), d.frame_extraction, d.frame_sample, d.frame_stride, d.fps)
    items, findings = vd.scan(spec.data_paths(), d.resolution, d.caption_extension, d.repeats, rule, d.trigger)
    for f in findings:
        log(f"[{f.severity}] {f.path}: {f.message}")
        run.event(f"data {f.severity} {f.code}: {f.path}")
    items, held = hold_out(spec, run, items, log, quality is not None and quality.holds_out)

    dev = precision.device
    fp8 = precision.weights == torch.float8_e4m3fn
    cfg = memory.component_config(spec.model.id, spec.model.revision)
    spatial = family.vae_spatial_factor(memory.component_config(spec.model.id, spec.model.revision, "vae"))
    if dev.type == "cuda":  # before any weight loads (and before the run is billed for loading them)
        model = memory.memory_model(spec)
        tokens = max(model.window_tokens(f, w, h) for f, w, h in (it.bucket for it in items))
        gpu_gb = torch.cuda.get_device_properties(dev).total_memory / GiB
        dtype = "fp8" if fp8 else {torch.bfloat16: "bf16", torch.float16: "fp16"}.get(precision.weights, "fp32")
        memory.check_fits(spec, model, gpu_gb, dtype=dtype, tokens=tokens, what=f"{spec.model.id} at {tokens} latent tokens")
    if t.blocks_to_swap and t.blocks_to_swap >= cfg.get("num_layers", 40):
        raise SpecError(f"train.blocks_to_swap {t.blocks_to_swap} >= the model's {cfg.get('num_layers')} blocks",
                        hint=f"at most {cfg.get('num_layers', 40) - 1}")

    # load on the CPU; only the encoders visit the GPU while caching
    comps = family.load(spec.model.id, spec.model.revision, precision.autocast_dtype if fp8 else precision.weights)
    experts = family.experts(comps, t.experts)
    models = [comps.denoiser, comps.extra.get("transformer_2"), comps.vae, *comps.text_encoders,
              comps.extra.get("image_encoder")]
    for mod in models:
        if mod is not None:
            mod.requires_grad_(False)
            mod.eval()
    if fp8:
        n = sum(memory.store_fp8(tr, family.block_lists) for tr, _, _ in family.experts(comps, "both").values())
        log(f"fp8: {n} linear layers of the transformer blocks stored in float8")
    outside_autocast(comps.vae, [*comps.text_encoders, comps.extra.get("image_encoder")])
    comps.vae.to(dev)
    te = comps.text_encoders[0]
    te.to(dev)

    disk = dcache.DiskCache(cache_root or dcache.default_cache_root(), comps.identity)
    flips = (False, True) if d.flip else (False,)
    keys = {(i, f): disk.root / "latents" / f"{it.digest[:32]}_{'x'.join(map(str, it.bucket))}_{it.window_key}"
            f"{'_flip' if f else ''}.safetensors" for i, it in enumerate(items) for f in flips}
    by_path = {v: k for k, v in keys.items()}

    @torch.no_grad()
    def encode_windows(paths: list[Path]) -> list[dict[str, torch.Tensor]]:
        out = []
        for p in paths:  # one window at a time: buckets differ in frames and size
            i, f = by_path[p]
            px = vd.load_window(items[i], f).unsqueeze(0).to(dev)
            with precision.autocast():
                z = {"latents": family.encode_latents(comps, px)}
                if i2v:
                    z.update(family.encode_condition(comps, px))
            out.append({k: v[0].float() for k, v in z.items()})
        return out

    i2v = bool(comps.extra.get("i2v"))
    if i2v and comps.extra.get("image_encoder") is not None:
        comps.extra["image_encoder"].to(dev)
    if d.cache_latents:
        got = disk.get_many(keys.values(), encode_windows, batch=1)
    else:
        got = {p: encode_windows([p])[0] for p in keys.values()}
    latents = {k: got[p]["latents"] for k, p in keys.items()}
    conditions = {k: {n: v for n, v in got[p].items() if n != "latents"} for k, p in keys.items()} if i2v else None
    if i2v and comps.extra.get("image_encoder") is not None:
        comps.extra["image_encoder"].to("cpu")
    log(f"latents: {len(latents)} windows ({disk.hits} from the cache, {disk.misses} encoded)")
    run.event(f"latents: {len(latents)} ({disk.hits} from the cache in {disk.root}, {disk.misses} encoded)")

    @torch.no_grad()
    def encode_captions(caps: list[str]) -> list[dict[str, torch.Tensor]]:
        with precision.autocast():
            enc = family.encode_text(comps, caps, dev)
        return [{k: v.float() for k, v in family.cache_text(enc, j).items()} for j in range(len(caps))]

    prompts = load_video_prompts(spec.samples.prompts, d.resolution, d.resolution, t.seed,
                                 families.facts(family.name).guidance)
    scoring = image_prompts(spec, [it.caption for it in items], families.facts(family.name).guidance)
    hits0, misses0 = disk.hits, disk.misses
    cache_te = d.cache_text_encoder_outputs
    text = None
    sample_text: dict[str, dict[str, torch.Tensor]] = {}
    if cache_te:
        text = disk.texts((it.caption for it in items), encode_captions)
        log(f"text: {len(text)} captions ({disk.hits - hits0} from the cache, {disk.misses - misses0} encoded)")
    wanted = sorted({vp.prompt.prompt for vp in prompts} | {vp.prompt.negative for vp in prompts}
                    | {p.prompt for p in scoring} | {p.negative for p in scoring})
    if wanted:
        sample_text = dict(zip(wanted, encode_captions(wanted), strict=True))
    if cache_te:
        te.to("cpu")  # the encoder (Wan's umT5-XXL: 11 GB in bf16) off the GPU before the transformer arrives
        if dev.type == "cuda":
            torch.cuda.empty_cache()

    if d.cache_latents:
        report_cache_size(run, items, comps, list(keys.values()), [disk.text_path(c) for c in {it.caption for it in items}],
                          len(flips), spatial, log)

    swaps: list[memory.BlockSwap] = []
    targets = family.default_targets if m.target_modules == "all-linear" else m.target_modules
    torch.manual_seed(spec.train.seed)  # the adapters' init from the seed alone, whatever loading did before
    random.seed(spec.train.seed)
    for tr, _, _ in experts.values():
        attach_lora(tr, lora_config(spec, targets))
        swap = None
        if t.blocks_to_swap:  # with its own checkpointing: loads and drops around each block's backward
            swap = memory.swap_blocks(tr, t.blocks_to_swap, dev, blocks=family.blocks(tr))
            swaps.append(swap)
        elif t.gradient_checkpointing:
            tr.enable_gradient_checkpointing()
        memory.place(tr, dev, swap)
    if swaps and not t.gradient_checkpointing:
        log("block swap needs gradient checkpointing: turned on")
    if swaps:
        log(f"block swap: the frozen weights of {t.blocks_to_swap} of {len(family.blocks(experts[next(iter(experts))][0]))} "
            f"blocks stay in CPU RAM{' (no effect on CPU)' if dev.type != 'cuda' else ''}")
    recipe = VideoRecipe(spec, run, precision, comps, items, latents, text, prompts, sample_text, not cache_te,
                         experts=experts, swaps=swaps, conditions=conditions)
    recipe.score_prompts, recipe.holdout = scoring, held
    info = vd.describe(items)
    log(f"data: {info['files']} files -> {info['windows']} windows, {info['samples_per_epoch']} samples per epoch, "
        f"buckets (frames x w x h) {info['buckets']}")
    run.event(f"video data: {json.dumps(info)}")
    return recipe, findings, disk


class VideoRecipe(DiffusionRecipe):
    def __init__(self, spec, run, precision, comps: Components, items, latents, text, prompts: list[VideoPrompt],
                 sample_text, live_captions, *, experts: dict, swaps: list[memory.BlockSwap],
                 conditions: dict | None = None) -> None:
        self.experts = experts
        self.conditions = conditions  # I2V: per window, the mask + first-frame latents (+ CLIP image states)
        self.swaps = swaps
        self.video_prompts = prompts
        super().__init__(spec, run, precision, comps, items, latents, text, [vp.prompt for vp in prompts],
                         sample_text, live_captions)
        # an expert not being trained stays in CPU RAM (two 14B experts do not share a 24 GB card);
        # it visits the GPU only to sample, block by block (``idle_swap``)
        self.idle = {n: v[0] for n, v in comps.family.experts(comps, "both").items() if n not in experts}
        self._idle_swaps: dict[str, memory.BlockSwap] = {}

    def _lora_modules(self) -> dict[str, torch.nn.Module]:
        return {name: tr for name, (tr, _, _) in self.experts.items()}

    def _cond(self, batch: Batch) -> dict[str, torch.Tensor]:
        dev = self.precision.device
        if self.text is not None and not self.live_captions:
            out = {k: v.to(dev) for k, v in self.family.collate_text([self.text[self.items[i].caption]
                                                                      for i in batch.items]).items()}
        else:
            out = dict(self.family.encode_text(self.c, list(batch.captions), dev))
        if self.conditions is not None:
            per = [self.conditions[(i, f)] for i, f in zip(batch.items, batch.flips, strict=True)]
            out.update({k: torch.stack([c[k] for c in per]).to(dev) for k in per[0]})
        return out

    def _sigmas(self, n: int, gen: torch.Generator) -> torch.Tensor:
        s = sample_sigmas(n, self.spec.train.timestep_sampling, self.spec.train.timestep_shift, gen)
        lo = min(v[1] for v in self.experts.values())
        hi = max(v[2] for v in self.experts.values())
        return lo + (hi - lo) * s  # one expert alone: its own noise range only

    def per_sample_loss(self, batch: Batch, noise_seed: int, fixed_t: torch.Tensor | None = None) -> torch.Tensor:
        dev = self.precision.device
        x0 = torch.stack([self.latents[(i, f)] for i, f in zip(batch.items, batch.flips, strict=True)]).to(dev, torch.float32)
        gen = torch.Generator().manual_seed(noise_seed)
        noise = torch.randn(x0.shape, generator=gen)
        if self.spec.train.noise_offset:
            noise = noise + self.spec.train.noise_offset * torch.randn((x0.shape[0], x0.shape[1], 1, 1, 1), generator=gen)
        noise = noise.to(dev)
        n = x0.shape[0]
        if fixed_t is not None:  # evaluation levels, inside the trained experts' range
            lo, hi = min(v[1] for v in self.experts.values()), max(v[2] for v in self.experts.values())
            s = (lo + (hi - lo) * fixed_t.float()).to(dev)
        else:
            s = self._sigmas(n, gen).to(dev)
        sv = s.view(-1, 1, 1, 1, 1)
        noisy = (1 - sv) * x0 + sv * noise
        cond = self._cond(batch)
        pred = torch.zeros_like(x0)
        for tr, lo, hi in self.experts.values():
            sel = ((s >= lo) & ((s < hi) | (hi >= 1.0))).nonzero().flatten()
            if len(sel):
                # sigma in fp32: the transformer takes sigma * 1000, which bf16 would round to steps of 4
                out = self.family.forward(self.c, noisy[sel].to(tr.dtype), s[sel].float(),
                                          {k: v[sel] for k, v in cond.items()}, {}, model=tr)
                pred = pred.index_put((sel,), out.float())
        target = noise - x0
        return F.mse_loss(pred, target, reduction="none").mean(dim=(1, 2, 3, 4))

    # -- files
    def export(self, out_dir: Path, state: TrainState | None) -> None:
        pipeline_cls = self.family.lora_file_writer()
        parts = self.adapter_parts()
        m = self.spec.method
        steps, epochs = (state.step, state.epoch) if state else (0, 0)
        by_folder: dict[str, list[str]] = {}
        for it in self.items:
            by_folder.setdefault(it.path.parent.name, []).append(it.caption)
        meta = kohya.kohya_metadata(self.spec, self.family.name, "flow", len(self.items), steps, epochs,
                                     kohya.tag_frequency(by_folder))
        meta["ss_target_frames"] = json.dumps(self.spec.data.target_frames)
        name = self.spec.output.name or "lora"
        two = self.family.separate_expert_files(set(parts), self.spec.train.experts)
        for comp, sd in parts.items():
            config = json.loads(json.dumps(self.lora_modules[comp].peft_config["default"].to_dict(), default=list))
            suffix = kohya.EXPERT_FILES[comp] if two else ""
            pipeline_cls.save_lora_weights(str(out_dir), transformer_lora_layers=sd, safe_serialization=True,
                                          weight_name=f"pytorch_lora_weights{suffix}.safetensors",
                                          transformer_lora_adapter_metadata=config)
            tensors = kohya.to_kohya({"transformer": sd}, self.family.name, m.alpha, m.rslora)
            kohya.save_kohya(out_dir / f"{name}{suffix}.safetensors", tensors, meta)

    # -- samples
    @torch.no_grad()
    def write_samples(self, state: TrainState, tag: str) -> list[Path]:
        if not self.video_prompts:
            return []
        import numpy as np

        from lorapod.data.clips import write_clip

        pipe = self.family.pipeline(self.c)
        pipe.set_progress_bar_config(disable=True)
        out_dir = self.run.samples
        out_dir.mkdir(parents=True, exist_ok=True)
        rows, paths = [], []
        self._idle_in()
        with torch.random.fork_rng(devices=[self.precision.device] if self.precision.device.type == "cuda" else []):
            for mod in self.lora_modules.values():
                mod.eval()
            for k, vp in enumerate(self.video_prompts):
                sp = vp.prompt
                pos = self._prompt_embeds(sp.prompt)
                neg = self._prompt_embeds(sp.negative) if sp.scale > 1 else None
                gen = torch.Generator(device="cpu").manual_seed(sp.seed)
                extra = {"image": self._start_image(vp)} if self.conditions is not None else {}
                self.family.prepare_sampling(pipe, sp.scale)
                with self.precision.autocast():
                    frames = pipe(**self.family.sample_kwargs(pos, neg, sp.scale), **extra, width=sp.width, height=sp.height,
                                  num_frames=vp.frames, num_inference_steps=sp.steps, generator=gen,
                                  output_type="np").frames[0]
                arr = (np.clip(frames, 0, 1) * 255).round().astype(np.uint8)
                path = write_clip(out_dir / f"{tag}-{k:02d}.mp4", list(arr), fps=self.family.sample_fps)
                paths.append(path)
                rows.append(arr)
            labels = [f"{smp.sample_label(vp.prompt)}, {vp.frames} frames" for vp in self.video_prompts]
            contact_sheet(rows, labels, f"{tag}: step {state.step}, epoch {state.epoch}, LoRA strength 1.0").save(
                out_dir / f"{tag}-frames.png", pnginfo=smp.png_info(self.video_prompts[0].prompt, state.step, state.epoch))
        self._idle_out()
        self.train()
        self.run.event(f"samples {tag}: {len(paths)} clip(s) in {out_dir}")
        return paths

    def _idle_in(self) -> None:
        """An expert not being trained comes to the GPU to sample, block by block."""
        dev = self.precision.device
        for name, tr in self.idle.items():
            if name not in self._idle_swaps:
                blocks = self.family.blocks(tr)
                self._idle_swaps[name] = memory.BlockSwap(torch.nn.ModuleList(blocks), idle_swap_count(blocks, tr, dev),
                                                          dev)
            memory.place(tr, dev, self._idle_swaps[name])

    def _idle_out(self) -> None:
        for name, tr in self.idle.items():  # back to CPU RAM (its swapped blocks never left it)
            self._idle_swaps[name].settle()
            memory.place(tr, torch.device("cpu"), self._idle_swaps[name])
        if self.precision.device.type == "cuda":
            torch.cuda.empty_cache()

    def score_frames(self) -> int:
        """Frames of a scoring clip: the longest trained window up to :data:`SCORE_FRAMES` (4n+1)."""
        fit = [f for f in self.spec.data.target_frames if f <= SCORE_FRAMES]
        return max(fit) if fit else 1

    @torch.no_grad()
    def render(self, sp, strength: float) -> list:
        """A short clip of a scoring prompt with the LoRA at ``strength`` (0: disabled), as frames:
        what the quality autopilot scores (its first, middle and last frames)."""
        import numpy as np
        from PIL import Image

        from lorapod.engine.diffusion.lora import lora_strength

        pipe = self.family.pipeline(self.c)
        pipe.set_progress_bar_config(disable=True)
        res = self.spec.data.resolution
        n = self.score_frames()
        self._idle_in()
        try:
            with torch.random.fork_rng(devices=[self.precision.device] if self.precision.device.type == "cuda" else []):
                for mod in self.lora_modules.values():
                    mod.eval()
                with lora_strength(self.lora_modules.values(), strength):
                    pos = self._prompt_embeds(sp.prompt)
                    neg = self._prompt_embeds(sp.negative) if sp.scale > 1 else None
                    gen = torch.Generator(device="cpu").manual_seed(sp.seed)
                    extra = ({"image": self._start_image(VideoPrompt(smp.SamplePrompt(sp.prompt, res, res, sp.seed,
                                                                                      sp.steps, sp.scale), n))}
                             if self.conditions is not None else {})
                    self.family.prepare_sampling(pipe, sp.scale)
                    with self.precision.autocast():
                        frames = pipe(**self.family.sample_kwargs(pos, neg, sp.scale), **extra, width=sp.width or res,
                                      height=sp.height or res, num_frames=n, num_inference_steps=sp.steps,
                                      generator=gen, output_type="np").frames[0]
        finally:
            self._idle_out()
        self.train()
        arr = (np.clip(frames, 0, 1) * 255).round().astype(np.uint8)
        return [Image.fromarray(f) for f in arr]

    @staticmethod
    def reference_frames(path: Path):
        """A reference (or training file) as the image the scorers see: an image, or a clip's first frame."""
        from PIL import Image

        from lorapod.data.clips import VIDEO_EXTS, read_frames

        if Path(path).suffix.lower() in VIDEO_EXTS:
            return read_frames(Path(path), [0])[0].convert("RGB")
        with Image.open(path) as im:
            return im.convert("RGB")

    def _start_image(self, vp: VideoPrompt):
        """I2V samples start from ``--i IMAGE``, else from the first frame of the first training window."""
        from PIL import Image

        if vp.image:
            with Image.open(vp.image) as im:
                return im.convert("RGB")
        x = vd.load_window(self.items[0])[:, 0]
        return Image.fromarray(((x.permute(1, 2, 0) + 1) * 127.5).round().clamp(0, 255).byte().numpy())

    def _prompt_embeds(self, text: str) -> dict[str, torch.Tensor]:
        dev = self.precision.device
        dtype = self.c.denoiser.dtype
        one = (self.family.collate_text([self.sample_text[text]]) if text in self.sample_text
               else self.family.encode_text(self.c, [text], dev))
        return {k: v.to(dev, dtype if v.is_floating_point() else v.dtype) for k, v in one.items()}


def contact_sheet(clips, labels: list[str] | None = None, title: str = "", per_row: int = 8):
    """One row per clip: up to ``per_row`` frames evenly spaced from first to last; with ``labels``
    (one per clip) each row says what it is and each column which frame of the longest clip it shows."""
    import numpy as np
    from PIL import Image

    h = max(c.shape[1] for c in clips)
    w = max(c.shape[2] for c in clips)
    cols = min(per_row, max(c.shape[0] for c in clips))
    g = smp.GUTTER
    sheet = Image.new("RGB", (cols * w + (cols - 1) * g, len(clips) * h + (len(clips) - 1) * g), smp.BACKGROUND)
    for r, c in enumerate(clips):
        picks = np.linspace(0, c.shape[0] - 1, min(cols, c.shape[0])).round().astype(int)
        for j, fi in enumerate(picks):
            sheet.paste(Image.fromarray(c[fi]), (j * (w + g), r * (h + g)))
    if labels is None:
        return sheet
    n = max(c.shape[0] for c in clips)
    frames = [str(int(fi) + 1) for fi in np.linspace(0, n - 1, cols).round().astype(int)]
    return smp.labelled_grid(sheet, labels, frames, title, corner="frame")
