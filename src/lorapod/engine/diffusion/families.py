"""Model families as a small registry: what differs between SD 1.5, SDXL, FLUX.1 and FLUX.2 klein.

A family knows how to load its pipeline, encode captions, turn pixels into latents, call its
denoiser, which layers LoRA should target by default and how to build a sampling pipeline from
the in-memory (LoRA-carrying) components. Everything else (data, caching, loss, loop, export)
is shared and lives beside this module.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import torch

from lorapod.errors import ModelLoadError, SpecError

_PIPELINE_FAMILY = {
    "StableDiffusionPipeline": "sd15",
    "StableDiffusionXLPipeline": "sdxl",
    "FluxPipeline": "flux1",
    "Flux2KleinPipeline": "flux2",
    "Flux2Pipeline": "flux2-dev",
    "WanPipeline": "wan21",
    "StableDiffusion3Pipeline": "sd3",
}


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


# ----------------------------------------------------------------------------- detection


def _single_file_family(path: Path) -> str:
    """Read the tensor names of a .safetensors checkpoint (header only) and name its family."""
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as fh:
        keys = set(fh.keys())

    def has(*names: str) -> bool:
        return any(n in keys or f"model.diffusion_model.{n}" in keys for n in names)

    if has("single_stream_modulation.lin.weight"):
        return "flux2"
    if has("double_blocks.0.img_attn.qkv.weight"):
        return "flux1"
    if any(k.startswith("conditioner.embedders.1.") for k in keys):
        return "sdxl"
    if any(k.startswith("cond_stage_model.model.") for k in keys):
        return "sd2"
    if any(k.startswith("cond_stage_model.transformer.") for k in keys) or has("input_blocks.0.0.weight"):
        return "sd15"
    return "unknown"


def detect(model_id: str, revision: str | None = None) -> tuple[str, str]:
    """(family, what was found) for a local folder, a single file or a hub id, before any loading."""
    p = Path(model_id).expanduser()
    if p.is_file():
        if p.suffix != ".safetensors":
            raise ModelLoadError(f"{p} is not a .safetensors file", hint="convert it to .safetensors, or use a diffusers folder")
        fam = _single_file_family(p)
        return fam, f"single-file checkpoint {p.name} ({fam})"
    if p.is_dir():
        index = p / "model_index.json"
        if not index.is_file():
            raise ModelLoadError(f"{p} has no model_index.json: not a diffusers pipeline folder",
                                 hint="point model.id at a diffusers folder, a hub id or a .safetensors file")
        raw = json.loads(index.read_text(encoding="utf-8"))
    else:
        try:
            from huggingface_hub import hf_hub_download

            raw = json.loads(Path(hf_hub_download(model_id, "model_index.json", revision=revision)).read_text())
        except Exception as exc:
            raise ModelLoadError(f"could not read model_index.json of {model_id} ({exc.__class__.__name__}: {exc})",
                                 hint="check the id, your network, and `huggingface-cli login` for gated models") from exc
    cls = raw.get("_class_name", "?")
    if cls in ("WanPipeline", "WanImageToVideoPipeline"):  # 2.1 or 2.2 (two experts): read from the index
        from lorapod.catalog.models import wan_family_of_index  # the planner's reading too

        return wan_family_of_index(raw) or "unknown", cls
    return _PIPELINE_FAMILY.get(cls, "unknown"), f"{cls}"


def resolve_family(spec_family: str, model_id: str, revision: str | None = None) -> Family:
    """The family to train, refusing a base model of another family before anything is cached."""
    found, what = detect(model_id, revision)
    if spec_family in ("auto", "llm"):
        if found not in FAMILIES:
            raise ModelLoadError(f"{model_id} is a {what}, which lorapod's image engine does not train",
                                 hint=f"supported: {', '.join(FAMILIES)}")
        return FAMILIES[found]()
    if spec_family not in FAMILIES:
        raise SpecError(f"model.family {spec_family} is not trained by the image engine yet",
                        hint=f"supported: {', '.join(FAMILIES)}")
    if found != spec_family:
        raise ModelLoadError(
            f"the spec says model.family {spec_family}, but {model_id} is a {what} (family {found})",
            hint=f"set model.family: {found}" if found in FAMILIES else "use a base model of the spec's family",
        )
    return FAMILIES[spec_family]()


# ----------------------------------------------------------------------------- families


class Family:
    name: ClassVar[str]
    pipeline_class: ClassVar[str]
    denoiser_name: ClassVar[str] = "unet"
    flow: ClassVar[bool] = False  # flow matching (Flux) vs DDPM noise prediction (SD)
    default_targets: ClassVar[list[str] | str] = []
    te_targets: ClassVar[list[str]] = ["q_proj", "k_proj", "v_proj", "out_proj"]
    kohya_te_prefixes: ClassVar[list[str]] = []  # per text encoder; [] = no text-encoder LoRA
    kohya_prefix: ClassVar[str] = "lora_unet"  # unused: kohya names are lorapod.export.kohya.LAYOUTS (one per family)

    def pipeline_cls(self):
        import diffusers

        return getattr(diffusers, self.pipeline_class)

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

    def latent_size(self, c: Components, bucket: tuple[int, int]) -> tuple[int, int]:
        f = 2 ** (len(c.vae.config.block_out_channels) - 1)
        return bucket[1] // f, bucket[0] // f

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


class SD15(Family):
    name = "sd15"
    pipeline_class = "StableDiffusionPipeline"
    # the attention and feed-forward layers of every transformer block (what kohya's LoRA trains)
    default_targets = ["to_q", "to_k", "to_v", "to_out.0", "proj_in", "proj_out", "ff.net.0.proj", "ff.net.2"]
    kohya_te_prefixes = ["lora_te"]

    def components(self, pipe, model_id: str) -> Components:
        return Components(self, model_id, pipe.unet, pipe.vae, [pipe.text_encoder], [pipe.tokenizer], pipe.scheduler)

    def _tokens(self, tok, captions: list[str], device) -> torch.Tensor:
        return tok(captions, padding="max_length", max_length=tok.model_max_length, truncation=True,
                   return_tensors="pt").input_ids.to(device)

    def encode_text(self, c, captions, device):
        te = c.text_encoders[0]
        return {"prompt_embeds": te(self._tokens(c.tokenizers[0], captions, device))[0]}

    def forward(self, c, noisy, t, cond, meta):
        return c.denoiser(noisy, t, encoder_hidden_states=cond["prompt_embeds"].to(noisy.dtype)).sample

    def pipeline(self, c):
        from diffusers import StableDiffusionPipeline

        return StableDiffusionPipeline(vae=c.vae, text_encoder=c.text_encoders[0], tokenizer=c.tokenizers[0],
                                       unet=c.denoiser, scheduler=c.scheduler, safety_checker=None,
                                       feature_extractor=None, requires_safety_checker=False)

    def sample_kwargs(self, pos, neg, scale):
        kw = {"prompt_embeds": pos["prompt_embeds"], "guidance_scale": scale}
        if neg is not None:
            kw["negative_prompt_embeds"] = neg["prompt_embeds"]
        return kw


class SDXL(SD15):
    name = "sdxl"
    pipeline_class = "StableDiffusionXLPipeline"
    kohya_te_prefixes = ["lora_te1", "lora_te2"]

    def components(self, pipe, model_id):
        return Components(self, model_id, pipe.unet, pipe.vae, [pipe.text_encoder, pipe.text_encoder_2],
                          [pipe.tokenizer, pipe.tokenizer_2], pipe.scheduler)

    def encode_text(self, c, captions, device):
        hidden, pooled = [], None
        for tok, te in zip(c.tokenizers, c.text_encoders, strict=True):
            out = te(self._tokens(tok, captions, device), output_hidden_states=True)
            pooled = out[0]  # the last encoder (with projection) gives the pooled embedding
            hidden.append(out.hidden_states[-2])
        return {"prompt_embeds": torch.cat(hidden, dim=-1), "pooled": pooled}

    def forward(self, c, noisy, t, cond, meta):
        added = {"text_embeds": cond["pooled"].to(noisy.dtype), "time_ids": meta["time_ids"].to(noisy.device, noisy.dtype)}
        return c.denoiser(noisy, t, encoder_hidden_states=cond["prompt_embeds"].to(noisy.dtype),
                          added_cond_kwargs=added).sample

    def pipeline(self, c):
        from diffusers import StableDiffusionXLPipeline

        return StableDiffusionXLPipeline(vae=c.vae, text_encoder=c.text_encoders[0], text_encoder_2=c.text_encoders[1],
                                         tokenizer=c.tokenizers[0], tokenizer_2=c.tokenizers[1], unet=c.denoiser,
                                         scheduler=c.scheduler)

    def sample_kwargs(self, pos, neg, scale):
        kw = {"prompt_embeds": pos["prompt_embeds"], "pooled_prompt_embeds": pos["pooled"], "guidance_scale": scale}
        if neg is not None:
            kw["negative_prompt_embeds"] = neg["prompt_embeds"]
            kw["negative_pooled_prompt_embeds"] = neg["pooled"]
        return kw


def pack(latents: torch.Tensor) -> torch.Tensor:
    """(B, C, H, W) -> (B, H/2 * W/2, C*4): Flux's 2x2 patch tokens."""
    b, ch, h, w = latents.shape
    x = latents.view(b, ch, h // 2, 2, w // 2, 2).permute(0, 2, 4, 1, 3, 5)
    return x.reshape(b, (h // 2) * (w // 2), ch * 4)


def unpack(tokens: torch.Tensor, h: int, w: int) -> torch.Tensor:
    b, _n, d = tokens.shape
    ch = d // 4
    x = tokens.view(b, h // 2, w // 2, ch, 2, 2).permute(0, 3, 1, 4, 2, 5)
    return x.reshape(b, ch, h, w)


class Flux1(Family):
    name = "flux1"
    pipeline_class = "FluxPipeline"
    denoiser_name = "transformer"
    flow = True
    # diffusers' own Flux LoRA script targets, plus the single blocks' MLP input
    default_targets = ["attn.to_q", "attn.to_k", "attn.to_v", "attn.to_out.0", "attn.add_q_proj", "attn.add_k_proj",
                       "attn.add_v_proj", "attn.to_add_out", "ff.net.0.proj", "ff.net.2", "ff_context.net.0.proj",
                       "ff_context.net.2", "proj_mlp"]

    def components(self, pipe, model_id):
        return Components(self, model_id, pipe.transformer, pipe.vae, [pipe.text_encoder, pipe.text_encoder_2],
                          [pipe.tokenizer, pipe.tokenizer_2], pipe.scheduler)

    def encode_text(self, c, captions, device):
        tok, tok2 = c.tokenizers
        te, te2 = c.text_encoders
        ids = tok(captions, padding="max_length", max_length=tok.model_max_length, truncation=True,
                  return_tensors="pt").input_ids.to(device)
        pooled = te(ids, output_hidden_states=False).pooler_output
        n = min(512, tok2.model_max_length)
        ids2 = tok2(captions, padding="max_length", max_length=n, truncation=True, return_tensors="pt").input_ids.to(device)
        return {"prompt_embeds": te2(ids2, output_hidden_states=False)[0], "pooled": pooled}

    def forward(self, c, noisy, t, cond, meta):
        b, _ch, h, w = noisy.shape
        tr = c.denoiser
        dev = noisy.device
        img_ids = torch.zeros(h // 2, w // 2, 3, device=dev)
        img_ids[..., 1] += torch.arange(h // 2, device=dev)[:, None]
        img_ids[..., 2] += torch.arange(w // 2, device=dev)[None, :]
        pe = cond["prompt_embeds"].to(noisy.dtype)
        guidance = torch.full((b,), 1.0, device=dev) if tr.config.guidance_embeds else None
        out = tr(hidden_states=pack(noisy), timestep=t, guidance=guidance, pooled_projections=cond["pooled"].to(noisy.dtype),
                 encoder_hidden_states=pe, txt_ids=torch.zeros(pe.shape[1], 3, device=dev),
                 img_ids=img_ids.reshape(-1, 3)).sample
        return unpack(out, h, w)

    def pipeline(self, c):
        from diffusers import FluxPipeline

        return FluxPipeline(scheduler=c.scheduler, vae=c.vae, text_encoder=c.text_encoders[0], tokenizer=c.tokenizers[0],
                            text_encoder_2=c.text_encoders[1], tokenizer_2=c.tokenizers[1], transformer=c.denoiser)

    def sample_kwargs(self, pos, neg, scale):
        kw = {"prompt_embeds": pos["prompt_embeds"], "pooled_prompt_embeds": pos["pooled"], "guidance_scale": scale}
        return kw


class Flux2Klein(Family):
    name = "flux2"
    pipeline_class = "Flux2KleinPipeline"
    denoiser_name = "transformer"
    flow = True
    default_targets = (r".*(\.to_q|\.to_k|\.to_v|\.to_out\.0|\.add_q_proj|\.add_k_proj|\.add_v_proj|\.to_add_out"
                       r"|\.to_qkv_mlp_proj|single_transformer_blocks\.\d+\.attn\.to_out)$")

    def components(self, pipe, model_id):
        return Components(self, model_id, pipe.transformer, pipe.vae, [pipe.text_encoder], [pipe.tokenizer],
                          pipe.scheduler, extra={"is_distilled": pipe.config.get("is_distilled", False)})

    def encode_text(self, c, captions, device):
        from diffusers import Flux2KleinPipeline

        tok = c.tokenizers[0]
        n = min(512, tok.model_max_length)
        te = c.text_encoders[0]
        layers = tuple(c.extra.get("text_encoder_out_layers", (9, 18, 27)))
        n_layers = te.config.num_hidden_layers
        if max(layers) > n_layers:  # tiny test encoders: spread the three layers over what exists
            layers = tuple(max(1, round(n_layers * k / 3)) for k in (1, 2, 3))
        pe = Flux2KleinPipeline._get_qwen3_prompt_embeds(te, tok, captions, device=device, max_sequence_length=n,
                                                         hidden_states_layers=layers)
        return {"prompt_embeds": pe}

    def encode_latents(self, c, pixels):
        from diffusers import Flux2KleinPipeline

        vae = c.vae
        z = vae.encode(pixels.to(vae.device, vae.dtype)).latent_dist.mode()
        z = Flux2KleinPipeline._patchify_latents(z)
        mean = vae.bn.running_mean.view(1, -1, 1, 1).to(z.device, z.dtype)
        std = torch.sqrt(vae.bn.running_var.view(1, -1, 1, 1) + vae.config.batch_norm_eps).to(z.device, z.dtype)
        return (z - mean) / std

    def latent_size(self, c, bucket):
        f = 2 ** (len(c.vae.config.block_out_channels) - 1) * 2
        return bucket[1] // f, bucket[0] // f

    def offset_noise(self, c, shape, gen):
        """The offset is drawn per VAE channel (before the 2x2 patchify), so it shifts a channel's
        brightness instead of adding a 2x2 pattern: the four patch positions of channel k
        (patchified channels 4k..4k+3) share its draw, divided by their batch-norm std so the shift
        is the same in the VAE's own latent (scaled by the channel's mean std, so it stays ~unit)."""
        b, ch = shape[0], shape[1]
        draw = torch.randn((b, ch // 4, 1, 1), generator=gen).repeat_interleave(4, dim=1)
        std = torch.sqrt(c.vae.bn.running_var.detach().float().cpu() + c.vae.config.batch_norm_eps)
        per_channel = std.view(ch // 4, 4).mean(dim=1).repeat_interleave(4)
        return draw * (per_channel / std).view(1, ch, 1, 1)

    def forward(self, c, noisy, t, cond, meta):
        from diffusers import Flux2KleinPipeline as P

        b, _ch, h, w = noisy.shape
        pe = cond["prompt_embeds"].to(noisy.dtype)
        tr = c.denoiser
        guidance = torch.full((b,), 1.0, device=noisy.device) if tr.config.guidance_embeds else None
        out = tr(hidden_states=P._pack_latents(noisy), encoder_hidden_states=pe, timestep=t, guidance=guidance,
                 img_ids=P._prepare_latent_ids(noisy).to(noisy.device), txt_ids=P._prepare_text_ids(pe).to(noisy.device)).sample
        return out.permute(0, 2, 1).reshape(b, -1, h, w)

    def pipeline(self, c):
        from diffusers import Flux2KleinPipeline

        return Flux2KleinPipeline(scheduler=c.scheduler, vae=c.vae, text_encoder=c.text_encoders[0],
                                  tokenizer=c.tokenizers[0], transformer=c.denoiser,
                                  is_distilled=c.extra.get("is_distilled", False))

    def sample_kwargs(self, pos, neg, scale):
        kw = {"prompt_embeds": pos["prompt_embeds"], "guidance_scale": scale}
        if neg is not None and scale > 1:
            kw["negative_prompt_embeds"] = neg["prompt_embeds"]
        return kw


FAMILIES: dict[str, type[Family]] = {"sd15": SD15, "sdxl": SDXL, "flux1": Flux1, "flux2": Flux2Klein}
