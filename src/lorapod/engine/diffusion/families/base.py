"""The family interface every diffusion family implements, and the loaded pipeline's parts.

A family knows how to load its pipeline, encode captions, turn pixels into latents, call its
denoiser, which layers LoRA should target by default and how to build a sampling pipeline from
the in-memory (LoRA-carrying) components. Everything else (data, caching, loss, loop, export)
is shared and lives beside this package.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import torch

from lorapod.errors import ModelLoadError


@dataclass
class Components:
    """A loaded pipeline's parts. ``denoiser`` is the UNet or transformer that carries the LoRA."""

    family: Family
    model_id: str
    denoiser: torch.nn.Module
    vae: torch.nn.Module
    text_encoders: list[torch.nn.Module | None]
    tokenizers: list[Any]
    scheduler: Any
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def identity(self) -> str:
        """What the caches are keyed on: the model and the config of the VAE / encoders."""
        import hashlib

        h = hashlib.sha256()
        h.update(f"{self.family.name}\n{self.model_id}\n".encode())
        h.update(json.dumps(dict(self.vae.config), sort_keys=True, default=str).encode())
        for m in [self.vae, *self.text_encoders]:
            if m is None:
                continue
            # a content fingerprint (shapes + the first values of every tensor), so a base model
            # rebuilt or fine-tuned at the same path never reuses stale latents; cheap even for SDXL
            for name, p in m.state_dict().items():
                h.update(f"{name}{tuple(p.shape)}".encode())
                h.update(p.detach().flatten()[:8].float().cpu().numpy().tobytes())
        return h.hexdigest()[:16]



# (regex on the diffusers module path, the consumer's module template with the regex groups, part, of parts):
# one rule of a family's kohya (ComfyUI ``lora_unet_``) layout; export/kohya.py reads them
Rule = tuple[str, str, int, int]


class Family:
    name: ClassVar[str]
    pipeline_class: ClassVar[str]
    denoiser_name: ClassVar[str] = "unet"
    flow: ClassVar[bool] = False  # flow matching (Flux) vs DDPM noise prediction (SD)
    default_targets: ClassVar[list[str] | str] = []
    te_targets: ClassVar[list[str]] = ["q_proj", "k_proj", "v_proj", "out_proj"]
    kohya_te_prefixes: ClassVar[list[str]] = []  # per text encoder; [] = no text-encoder LoRA
    # The kohya file's key rule (export/kohya.py ``Layout``): None while the family's layout is still
    # written in export/kohya.py; () = the diffusers module paths as they are; rules = renamed / fused.
    kohya_rules: ClassVar[tuple[Rule, ...] | None] = None
    # The denoiser's attribute(s) holding its transformer blocks, in order: what block swap keeps in
    # CPU RAM (engine/diffusion/memory.py) and fp8 stores; () = no block swap (the U-Nets)
    block_lists: ClassVar[tuple[str, ...]] = ()
    sample_steps: ClassVar[int] = 28  # the sample grids' default step count
    # ``lorapod inspect``'s name rules for files of this family (None: still written in export/inspect.py):
    # a regex the file's module names match only for this family (no metadata to read), the modules
    # ComfyUI maps under ``lora_unet_`` (its own model's module paths, dots as _), and whether it also
    # maps diffusers' ``transformer.<path>`` names
    inspect_signature: ClassVar[str | None] = None
    comfy_unet: ClassVar[str | None] = None
    comfy_takes_diffusers: ClassVar[bool] = False
    # ``lora_unet_`` module names a trainer writes for this family that ComfyUI's model does not hold,
    # each with why and what converts them (regex, reason): inspect names the reason for each
    comfy_refused: ClassVar[tuple[tuple[str, str], ...]] = ()

    # video families: the frame rate samples are written at
    sample_fps: ClassVar[int] = 16

    def text_len(self, c: Components) -> int:
        """Most text-encoder states one caption caches (the video path's cache-size prediction)."""
        return 512

    def cache_text(self, enc: dict[str, torch.Tensor], j: int) -> dict[str, torch.Tensor]:
        """Caption ``j``'s share of a batch ``encode_text`` made, as the cache keeps it (families whose
        captions have their own lengths keep only the real tokens here)."""
        return {k: v[j] for k, v in enc.items()}

    def prepare_sampling(self, pipe, scale: float) -> None:
        """Anything a pipeline takes other than from its call's arguments before it samples at ``scale``."""

    def experts(self, c: Components, which: str) -> dict[str, tuple[torch.nn.Module, float, float]]:
        """Module name -> (denoiser, lowest sigma, highest sigma) it is trained on: one, over all of them."""
        return {self.denoiser_name: (c.denoiser, 0.0, 1.0)}

    def vae_spatial_factor(self, vae_config: dict) -> int:
        """Pixels per latent along a side, read from the VAE's config.json before anything loads."""
        return 8

    def latent_channels(self, c: Components) -> int:
        cfg = c.vae.config
        return int(cfg.get("z_dim") or cfg.get("latent_channels"))

    def separate_expert_files(self, parts: set[str], experts: str) -> bool:
        """Whether an adapter of these components (``transformer``, ``transformer_2``, ...) trained with
        ``train.experts`` is written as one kohya file per expert (Wan2.2 A14B); one file otherwise.
        The engine's export and ``lorapod export`` both ask here, so they cannot disagree."""
        return False

    def blocks(self, denoiser: torch.nn.Module) -> list[torch.nn.Module]:
        """The denoiser's transformer blocks in the order they run (block swap's unit)."""
        return [b for attr in self.block_lists for b in getattr(denoiser, attr)]

    def default_sample_steps(self, c: Components) -> int:
        return self.sample_steps

    def collate_text(self, per: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        """Cached text-encoder outputs of one batch's captions, stacked (families whose captions have
        their own lengths pad them here)."""
        return {k: torch.stack([p[k] for p in per]) for k in per[0]}

    def pipeline_cls(self):
        import diffusers

        return getattr(diffusers, self.pipeline_class)

    def lora_file_writer(self):
        """What writes the diffusers LoRA file (``save_lora_weights``): the pipeline class's own loader."""
        return self.pipeline_cls()

    def load(self, model_id: str, revision: str | None, dtype: torch.dtype) -> Components:
        cls = self.pipeline_cls()
        p = Path(model_id).expanduser()
        try:
            if p.is_file():
                pipe = cls.from_single_file(str(p), torch_dtype=dtype)
            else:
                pipe = cls.from_pretrained(model_id, revision=revision, torch_dtype=dtype)
        except (OSError, ValueError) as exc:
            raise ModelLoadError(f"could not load {model_id} as {self.pipeline_class}: {exc}",
                                 hint="check the path or id; gated hub models need `huggingface-cli login`") from exc
        return self.components(pipe, model_id)

    def components(self, pipe, model_id: str) -> Components:
        raise NotImplementedError

    def prediction_type(self, c: Components) -> str:
        return "flow" if self.flow else c.scheduler.config.get("prediction_type", "epsilon")

    # text
    def encode_text(self, c: Components, captions: list[str], device: torch.device) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    # images
    def encode_latents(self, c: Components, pixels: torch.Tensor) -> torch.Tensor:
        vae = c.vae
        z = vae.encode(pixels.to(vae.device, vae.dtype)).latent_dist.mean
        shift = vae.config.get("shift_factor") or 0.0
        return (z - shift) * vae.config.scaling_factor

    def offset_noise(self, c: Components, shape: torch.Size, gen: torch.Generator) -> torch.Tensor:
        """Noise offset (Guttenberg 2023): one normal draw per sample and latent channel, constant over
        the image, broadcast to ``shape``. Families whose training latents are patchified override it."""
        return torch.randn((*shape[:2], *([1] * (len(shape) - 2))), generator=gen)

    # denoiser
    def forward(self, c: Components, noisy: torch.Tensor, t: torch.Tensor, cond: dict[str, torch.Tensor],
                meta: dict[str, torch.Tensor]) -> torch.Tensor:
        raise NotImplementedError

    # sampling
    def pipeline(self, c: Components):
        raise NotImplementedError

    def sample_kwargs(self, pos: dict[str, torch.Tensor], neg: dict[str, torch.Tensor] | None, scale: float) -> dict:
        raise NotImplementedError

