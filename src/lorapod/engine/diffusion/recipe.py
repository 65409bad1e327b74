"""The diffusion recipe: batches of cached latents, the noise/timestep/loss rule, samples, export.

It plugs into the shared loop (``lorapod.engine.loop.fit``) like the LLM recipe does. Batches
of an epoch depend only on (seed, epoch): order, flips, caption shuffles and even each batch's
noise seed, so a resumed run draws exactly the noise the uninterrupted run would have drawn.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from lorapod.engine import distributed
from lorapod.engine.checkpoint import TrainState
from lorapod.engine.device import Precision
from lorapod.engine.diffusion import dataset
from lorapod.engine.diffusion import samples as smp
from lorapod.engine.diffusion.dataset import ImageItem
from lorapod.engine.diffusion.families import Components
from lorapod.engine.loop import LossOut
from lorapod.export import kohya
from lorapod.export.diffusers import save_diffusers
from lorapod.fsutil import atomic_dir
from lorapod.rundir import RunDir
from lorapod.rundir.layout import checkpoint_name, sample_file, sample_tag
from lorapod.spec import JobSpec


@dataclass(frozen=True)
class Batch:
    items: tuple[int, ...]
    flips: tuple[bool, ...]
    captions: tuple[str, ...]  # after shuffle/dropout (used when text encoders run live)
    noise_seed: int


def sample_sigmas(n: int, mode: str, shift: float, gen: torch.Generator) -> torch.Tensor:
    """Flow-matching noise levels in (0, 1): uniform, logit-normal, or logit-normal shifted toward noise."""
    if mode == "uniform":
        s = torch.rand(n, generator=gen)
    else:
        s = torch.sigmoid(torch.randn(n, generator=gen))
        if mode == "shift":
            s = shift * s / (1 + (shift - 1) * s)
    return s.clamp(1e-4, 1 - 1e-4)


def min_snr_weights(alphas_cumprod: torch.Tensor, t: torch.Tensor, gamma: float, prediction: str) -> torch.Tensor:
    """Min-SNR-gamma (Hang et al. 2023): down-weight easy low-noise steps; for v the SNR is +1."""
    a = alphas_cumprod[t]
    snr = a / (1 - a)
    clipped = torch.clamp(snr, max=gamma)
    return clipped / (snr + 1) if prediction == "v_prediction" else clipped / snr


class DiffusionRecipe:
    unit = "it/s"

    def __init__(self, spec: JobSpec, run: RunDir, precision: Precision, comps: Components, items: list[ImageItem],
                 latents: dict[tuple[int, bool], torch.Tensor], text: dict[str, dict[str, torch.Tensor]] | None,
                 sample_prompts: list[smp.SamplePrompt], sample_text: dict[str, dict[str, torch.Tensor]],
                 live_captions: bool) -> None:
        from diffusers import DDPMScheduler

        self.spec, self.run, self.precision, self.c = spec, run, precision, comps
        self.family = comps.family
        self.items = items
        self.latents = latents
        self.text = text
        self.sample_prompts = sample_prompts
        self.sample_text = sample_text
        self.live_captions = live_captions
        self.prediction = self.family.prediction_type(comps)
        self.noise_sched = None if self.family.flow else DDPMScheduler.from_config(comps.scheduler.config)
        self._epoch_cache: dict[int, list[Batch]] = {}
        self.lora_modules = self._lora_modules()
        self._state: TrainState | None = None
        self.score_prompts: list = []  # the quality autopilot's (engine/autopilot.py), set by prepare
        self.holdout = None
        self.swap = None  # engine/diffusion/memory.py BlockSwap when train.blocks_to_swap keeps blocks in CPU RAM

    def _lora_modules(self) -> dict[str, torch.nn.Module]:
        mods = {self.family.denoiser_name: self.c.denoiser}
        if self.spec.method.train_text_encoder:
            for i, te in enumerate(self.c.text_encoders):
                mods["text_encoder" if i == 0 else f"text_encoder_{i + 1}"] = te
        return mods

    # -- data
    def epoch_batches(self, epoch: int) -> list[Batch]:
        if epoch not in self._epoch_cache:
            self._epoch_cache = {epoch: self._make_batches(epoch)}
        return self._epoch_cache[epoch]

    def _make_batches(self, epoch: int) -> list[Batch]:
        d = self.spec.data
        rng = random.Random(self.spec.train.seed * 1000 + epoch)
        entries = [(i, d.flip and rng.random() < 0.5) for i, it in enumerate(self.items) for _ in range(it.repeats)]
        rng.shuffle(entries)
        by_bucket: dict[tuple[int, int], list[tuple[int, bool]]] = {}
        for e in entries:
            by_bucket.setdefault(self.items[e[0]].bucket, []).append(e)
        bs = self.spec.train.micro_batch_size
        groups = [v[s : s + bs] for v in by_bucket.values() for s in range(0, len(v), bs)]
        rng.shuffle(groups)
        out = []
        for g in groups:
            caps = tuple(
                dataset.transform_caption(self.items[i].caption, rng, d.shuffle_captions, d.caption_dropout)
                if self.live_captions else self.items[i].caption
                for i, _ in g
            )
            out.append(Batch(tuple(i for i, _ in g), tuple(f for _, f in g), caps, rng.getrandbits(62)))
        return out

    def batch_units(self, batch: Batch) -> int:
        return len(batch.items)

    # -- model
    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        return [p for m in self.lora_modules.values() for p in m.parameters() if p.requires_grad]

    def train(self) -> None:
        for m in self.lora_modules.values():
            m.train()

    def _cond(self, batch: Batch) -> dict[str, torch.Tensor]:
        dev = self.precision.device
        if self.text is not None and not self.live_captions:
            per = [self.text[self.items[i].caption] for i in batch.items]
            return {k: v.to(dev) for k, v in self.family.collate_text(per).items()}
        return self.family.encode_text(self.c, list(batch.captions), dev)

    def _meta(self, batch: Batch) -> dict[str, torch.Tensor]:
        rows = []
        for i in batch.items:
            f = self.items[i].fit
            # SDXL size/crop conditioning: original (h, w), crop (top, left), target (h, w)
            rows.append([f.size[1], f.size[0], f.crop[1], f.crop[0], f.bucket[1], f.bucket[0]])
        return {"time_ids": torch.tensor(rows, dtype=torch.float32)}

    def per_sample_loss(self, batch: Batch, noise_seed: int, fixed_t: torch.Tensor | None = None) -> torch.Tensor:
        dev = self.precision.device
        x0 = torch.stack([self.latents[(i, f)] for i, f in zip(batch.items, batch.flips, strict=True)]).to(dev, torch.float32)
        gen = torch.Generator().manual_seed(noise_seed)
        noise = torch.randn(x0.shape, generator=gen)
        if self.spec.train.noise_offset:  # a per-channel brightness shift, in the VAE's channel space
            noise = noise + self.spec.train.noise_offset * self.family.offset_noise(self.c, x0.shape, gen)
        noise = noise.to(dev)
        n = x0.shape[0]
        cond, meta = self._cond(batch), self._meta(batch)
        dtype = self.c.denoiser.dtype
        if self.family.flow:
            s = (fixed_t if fixed_t is not None else sample_sigmas(n, self.spec.train.timestep_sampling,
                                                                   self.spec.train.timestep_shift, gen)).to(dev)
            sv = s.view(-1, 1, 1, 1)
            noisy = (1 - sv) * x0 + sv * noise
            pred = self.family.forward(self.c, noisy.to(dtype), s.to(dtype), cond, meta)
            target = noise - x0
            weights = torch.ones(n, device=dev)
        else:
            sched = self.noise_sched
            T = sched.config.num_train_timesteps
            t = (fixed_t if fixed_t is not None else torch.randint(0, T, (n,), generator=gen)).to(dev).long()
            noisy = sched.add_noise(x0, noise, t)
            pred = self.family.forward(self.c, noisy.to(dtype), t, cond, meta)
            target = sched.get_velocity(x0, noise, t) if self.prediction == "v_prediction" else noise
            gamma = self.spec.train.min_snr_gamma
            weights = (min_snr_weights(sched.alphas_cumprod.to(dev), t, gamma, self.prediction) if gamma
                       else torch.ones(n, device=dev))
        mse = F.mse_loss(pred.float(), target.float(), reduction="none").mean(dim=(1, 2, 3))
        return mse * weights

    def loss(self, batch: Batch) -> LossOut:
        return LossOut(self.per_sample_loss(batch, batch.noise_seed).sum(), len(batch.items))

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """Loss on the first images at fixed noise and three fixed noise levels: comparable across steps."""
        for m in self.lora_modules.values():
            m.eval()
        n = min(len(self.items), 2 * (self.spec.eval.max_batches or 1))
        levels = [0.25, 0.5, 0.75] if self.family.flow else [250, 500, 750]
        t = torch.tensor(levels, dtype=torch.float32 if self.family.flow else torch.long)
        total = 0.0
        for i in distributed.current().share(range(n)):  # one forward per image, its noise levels as a batch
            b = Batch((i,) * len(levels), (False,) * len(levels), (self.items[i].caption,) * len(levels), 0)
            with self.precision.autocast():
                total += float(self.per_sample_loss(b, 1000 + i, fixed_t=t).sum())
        (total,) = distributed.current().all_sum([total])
        return {"fixed_noise_loss": total / (n * len(levels))}

    # -- adapter
    def adapter_parts(self) -> dict[str, dict[str, torch.Tensor]]:
        from peft import get_peft_model_state_dict

        return {name: get_peft_model_state_dict(m) for name, m in self.lora_modules.items()}

    def adapter_state(self) -> dict[str, torch.Tensor]:
        return {f"{name}.{k}": v for name, sd in self.adapter_parts().items() for k, v in sd.items()}

    def load_adapter_state(self, state: dict[str, torch.Tensor]) -> None:
        from peft import set_peft_model_state_dict

        for name, m in self.lora_modules.items():
            sub = {k[len(name) + 1 :]: v for k, v in state.items() if k.startswith(name + ".")}
            set_peft_model_state_dict(m, sub)

    def export(self, out_dir: Path, state: TrainState | None) -> None:
        parts = self.adapter_parts()
        configs = {name: m.peft_config["default"].to_dict() for name, m in self.lora_modules.items()}
        save_diffusers(out_dir, self.family.lora_file_writer(), parts, configs)
        m = self.spec.method
        sizes = {n: mod.out_features for n, mod in self.c.denoiser.named_modules() if hasattr(mod, "out_features")}
        tensors = kohya.to_kohya(parts, self.family.name, m.alpha, m.rslora, out_features=sizes)
        steps = state.step if state else 0
        epochs = state.epoch if state else 0
        by_folder: dict[str, list[str]] = {}
        for it in self.items:
            by_folder.setdefault(it.path.parent.name, []).append(it.caption)
        meta = kohya.kohya_metadata(self.spec, self.family.name, self.prediction, len(self.items), steps, epochs,
                                     kohya.tag_frequency(by_folder))
        kohya.save_kohya(out_dir / f"{self.spec.output.name or 'lora'}.safetensors", tensors, meta)

    def save_final(self, out_dir: Path) -> None:
        with atomic_dir(out_dir) as tmp:
            self.export(tmp, self._state)

    def on_save(self, state: TrainState, path: Path | None) -> None:
        """Every checkpoint also gets both LoRA formats under exports/step-N (the best LoRA is often not the last)."""
        self._state = state
        with atomic_dir(self.run.root / "exports" / checkpoint_name(state.step)) as tmp:
                self.export(tmp, state)

    def on_step(self, state: TrainState) -> None:
        self._state = state
        s = self.spec.samples
        if s.every_steps and state.step % s.every_steps == 0:
            self.write_samples(state, sample_tag(state.step))

    def on_epoch_end(self, state: TrainState) -> None:
        self._state = state
        s = self.spec.samples
        if s.every_epochs and state.epoch % s.every_epochs == 0:
            self.write_samples(state, f"epoch{state.epoch:03d}")

    # -- samples
    @torch.no_grad()
    def write_samples(self, state: TrainState, tag: str) -> list[Path]:
        if not self.sample_prompts:
            return []
        pipe = self.family.pipeline(self.c)
        pipe.set_progress_bar_config(disable=True)
        out_dir = self.run.samples
        out_dir.mkdir(parents=True, exist_ok=True)
        images, paths = [], []
        with torch.random.fork_rng(devices=[self.precision.device] if self.precision.device.type == "cuda" else []):
            for m in self.lora_modules.values():
                m.eval()
            for k, sp in enumerate(self.sample_prompts):
                pos = self._prompt_embeds(sp.prompt)
                neg = self._prompt_embeds(sp.negative) if sp.scale > 1 else None
                gen = torch.Generator(device="cpu").manual_seed(sp.seed)
                with self.precision.autocast():
                    img = pipe(**self.family.sample_kwargs(pos, neg, sp.scale), width=sp.width, height=sp.height,
                               num_inference_steps=sp.steps, generator=gen, output_type="pil").images[0]
                path = out_dir / sample_file(tag, k, ".png")
                img.save(path, pnginfo=smp.png_info(sp, state.step, state.epoch))
                images.append(img)
                paths.append(path)
            smp.labelled_samples(images, self.sample_prompts, state.step, state.epoch, tag).save(
                out_dir / f"{tag}-grid.png")
        self.train()
        self.run.event(f"samples {tag}: {len(paths)} image(s) in {out_dir}")
        return paths

    @torch.no_grad()
    def render(self, sp, strength: float) -> list:
        """One image of a scoring prompt (quality/prompts.py ``ScorePrompt``) with the LoRA at
        ``strength`` (0: disabled, the base model), at the prompt's own seed: what the quality
        autopilot scores. The training's RNG streams are left as they were."""
        from lorapod.engine.diffusion.lora import lora_strength

        pipe = self.family.pipeline(self.c)
        pipe.set_progress_bar_config(disable=True)
        res = self.spec.data.resolution
        with torch.random.fork_rng(devices=[self.precision.device] if self.precision.device.type == "cuda" else []):
            for m in self.lora_modules.values():
                m.eval()
            # the text encoders' LoRA too (train_text_encoder): the prompt is encoded at that strength
            with lora_strength(self.lora_modules.values(), strength):
                pos = self._prompt_embeds(sp.prompt)
                neg = self._prompt_embeds(sp.negative) if sp.scale > 1 else None
                gen = torch.Generator(device="cpu").manual_seed(sp.seed)
                with self.precision.autocast():
                    img = pipe(**self.family.sample_kwargs(pos, neg, sp.scale), width=sp.width or res,
                               height=sp.height or res, num_inference_steps=sp.steps, generator=gen,
                               output_type="pil").images[0]
        self.train()
        return [img]

    def _prompt_embeds(self, text: str) -> dict[str, torch.Tensor]:
        dev = self.precision.device
        if text in self.sample_text:
            one = self.family.collate_text([self.sample_text[text]])
            return {k: v.to(dev, self.c.denoiser.dtype if v.is_floating_point() else v.dtype) for k, v in one.items()}
        out = self.family.encode_text(self.c, [text], dev)
        return {k: v.to(self.c.denoiser.dtype) for k, v in out.items()}


def describe(items: list[ImageItem]) -> dict[str, Any]:
    """Counts for the log: images, samples per epoch (with repeats), images per bucket."""
    buckets: dict[str, int] = {}
    for it in items:
        key = f"{it.bucket[0]}x{it.bucket[1]}"
        buckets[key] = buckets.get(key, 0) + 1
    return {"images": len(items), "samples_per_epoch": sum(it.repeats for it in items), "buckets": buckets}
