"""Wan2.1 and Wan2.2 text- and image-to-video on diffusers: the family.

``Wan21`` / ``Wan22``: ``WanPipeline`` with ``WanTransformer3DModel`` (flow matching, the
transformer takes the timestep as ``sigma * 1000``), ``AutoencoderKLWan`` (latents normalised by
the config's per-channel ``latents_mean`` / ``latents_std``, as the pipeline decodes them) and
umT5 text states (padded with zeros to the pipeline's sequence length). Wan2.2 A14B has two
experts: ``transformer`` denoises noise levels at or above ``boundary_ratio``, ``transformer_2``
the rest; each trains on its own range. Its memory savers and file layout are in
``engine/diffusion/wan.py``.
"""

from __future__ import annotations

from typing import ClassVar

import torch

from lorapod.engine.diffusion.families.base import Components, Family, Rule

# every Linear of the attention blocks: self- and cross-attention q/k/v/out and the feed-forward
# (musubi-tuner's Wan LoRA targets; diffusers names)
WAN_TARGETS = (r"^blocks\.\d+\.(attn1\.(to_q|to_k|to_v|to_out\.0)|attn2\.(to_q|to_k|to_v|to_out\.0|add_k_proj|add_v_proj)"
               r"|ffn\.net\.(0\.proj|2))$")  # add_k/v_proj: the image keys/values of Wan2.1 I2V
TEXT_LEN = 512  # WanPipeline's max_sequence_length: prompts are padded with zeros to it
SAMPLE_FPS = 16

# Wan 2.1 / 2.2: diffusers' WanTransformer3DModel paths -> the original Wan module paths
# (``blocks.N.self_attn.q``, ``cross_attn.k_img``, ``ffn.0``, ``head.head``) that ComfyUI's WanModel
# maps under ``lora_unet_`` (comfy/lora.py model_lora_keys_unet) and diffusers' own loader reads
# back (diffusers/loaders/lora_conversion_utils.py ``_convert_non_diffusers_wan_lora_to_diffusers``
# at the installed version: self_attn/cross_attn q, k, v, o; k_img/v_img <- add_k_proj/add_v_proj;
# ffn.0/ffn.2 <- ffn.net.0.proj/ffn.net.2; time_projection.1 <- condition_embedder.time_proj;
# head.head <- proj_out). One rule for the engine's file and ``lorapod export --to comfyui``.
WAN_RULES: list[Rule] = [
    *((rf"blocks\.(\d+)\.{attn}\.{d}", f"blocks.{{0}}.{w}.{o}", 0, 1)
      for attn, w in (("attn1", "self_attn"), ("attn2", "cross_attn"))
      for d, o in (("to_q", "q"), ("to_k", "k"), ("to_v", "v"), (r"to_out\.0", "o"),
                   ("add_k_proj", "k_img"), ("add_v_proj", "v_img"))),
    (r"blocks\.(\d+)\.ffn\.net\.0\.proj", "blocks.{0}.ffn.0", 0, 1),
    (r"blocks\.(\d+)\.ffn\.net\.2", "blocks.{0}.ffn.2", 0, 1),
    (r"condition_embedder\.time_proj", "time_projection.1", 0, 1),
    (r"proj_out", "head.head", 0, 1),
]


class Wan21(Family):
    name = "wan21"
    pipeline_class = "WanPipeline"
    denoiser_name = "transformer"
    flow = True
    video: ClassVar[bool] = True
    default_targets = WAN_TARGETS
    block_lists = ("blocks",)
    kohya_rules = tuple(WAN_RULES)
    sample_fps = SAMPLE_FPS

    def vae_spatial_factor(self, vae_config):
        """Wan2.1's VAE: 8; Wan2.2 TI2V's: 16 (``scale_factor_spatial``)."""
        return int(vae_config.get("scale_factor_spatial", 8))

    def load(self, model_id, revision, dtype):
        """T2V (``WanPipeline``) or I2V (``WanImageToVideoPipeline``), as the model's index says."""
        from lorapod.engine.diffusion.families.detect import detect

        cls = detect(model_id, revision)[1]
        self.pipeline_class = cls if cls in ("WanPipeline", "WanImageToVideoPipeline") else "WanPipeline"
        return super().load(model_id, revision, dtype)

    def components(self, pipe, model_id: str) -> Components:
        i2v = type(pipe).__name__ == "WanImageToVideoPipeline"
        return Components(self, model_id, pipe.transformer, pipe.vae, [pipe.text_encoder], [pipe.tokenizer],
                          pipe.scheduler, extra={"transformer_2": getattr(pipe, "transformer_2", None),
                                                 "boundary_ratio": pipe.config.get("boundary_ratio"), "i2v": i2v,
                                                 "image_encoder": getattr(pipe, "image_encoder", None) if i2v else None,
                                                 "image_processor": getattr(pipe, "image_processor", None) if i2v else None})

    def text_len(self, c: Components) -> int:
        """WanPipeline's ``max_sequence_length``: it pads every prompt to 512 whatever the tokenizer's
        ``model_max_length`` says, and so must training, or the LoRA learns with a different number
        of padding tokens in the cross-attention than every pipeline samples with."""
        return TEXT_LEN

    def encode_text(self, c, captions, device):
        """umT5 states as WanPipeline makes them: real tokens kept, the padding zeroed; ``length``
        says how many are real, so the cache can store only those."""
        from diffusers.pipelines.wan.pipeline_wan import prompt_clean

        tok, te = c.tokenizers[0], c.text_encoders[0]
        n = self.text_len(c)
        enc = tok([prompt_clean(t) for t in captions], padding="max_length", max_length=n, truncation=True,
                  add_special_tokens=True, return_attention_mask=True, return_tensors="pt")
        mask = enc.attention_mask.to(device)
        states = te(enc.input_ids.to(device), mask).last_hidden_state
        return {"prompt_embeds": states * mask.unsqueeze(-1).to(states.dtype), "length": mask.sum(dim=1)}

    def cache_text(self, enc, j):
        """Only the real umT5 tokens are cached (``length``); ``collate_text`` pads them again."""
        return {"prompt_embeds": enc["prompt_embeds"][j, : int(enc["length"][j])]}

    def collate_text(self, per):
        """Padded with zeros to the pipeline's 512 (``text_len``), as WanPipeline samples."""
        import torch.nn.functional as F

        return {"prompt_embeds": torch.stack([F.pad(p["prompt_embeds"], (0, 0, 0, TEXT_LEN - p["prompt_embeds"].shape[0]))
                                              for p in per])}

    def encode_latents(self, c, pixels):
        """(B, 3, F, H, W) in [-1, 1] -> normalised latents (B, z, 1 + (F-1)/4, H/8, W/8)."""
        vae = c.vae
        z = vae.encode(pixels.to(vae.device, vae.dtype)).latent_dist.mode()
        mean = torch.tensor(vae.config.latents_mean, device=z.device, dtype=z.dtype).view(1, -1, 1, 1, 1)
        std = torch.tensor(vae.config.latents_std, device=z.device, dtype=z.dtype).view(1, -1, 1, 1, 1)
        return (z - mean) / std

    def encode_condition(self, c, pixels):
        """I2V: what the pipeline conditions on, from a window's first frame: a mask (4 channels, 1 on
        the first latent frame) + the latents of [first frame, black frames...], and (Wan2.1) the
        CLIP vision states of the first frame (``hidden_states[-2]``)."""
        vae = c.vae
        video = torch.cat([pixels[:, :, :1], torch.zeros_like(pixels[:, :, 1:])], dim=2)
        z = self.encode_latents(c, video)
        mask = torch.zeros(z.shape[0], 4, *z.shape[2:], device=z.device, dtype=z.dtype)
        mask[:, :, 0] = 1.0
        out = {"condition": torch.cat([mask, z], dim=1)}
        enc, proc = c.extra.get("image_encoder"), c.extra.get("image_processor")
        if enc is not None:
            first = ((pixels[:, :, 0].float() + 1) * 127.5).round().clamp(0, 255).to(torch.uint8).cpu()
            px = proc(images=list(first), return_tensors="pt").pixel_values.to(vae.device, enc.dtype)
            out["image_embeds"] = enc(pixel_values=px, output_hidden_states=True).hidden_states[-2]
        return out

    def forward(self, c, noisy, t, cond, meta, model=None):
        tr = model if model is not None else c.denoiser
        pe = cond["prompt_embeds"].to(noisy.dtype)
        if "condition" in cond:  # I2V: the noisy latents, then the mask and the first-frame latents
            noisy = torch.cat([noisy, cond["condition"].to(noisy.dtype)], dim=1)
        img = cond.get("image_embeds")
        return tr(hidden_states=noisy, timestep=t * 1000, encoder_hidden_states=pe, return_dict=False,
                  encoder_hidden_states_image=None if img is None else img.to(noisy.dtype))[0]

    def pipeline(self, c):
        from diffusers import WanImageToVideoPipeline, WanPipeline

        if c.extra.get("i2v"):
            return WanImageToVideoPipeline(tokenizer=c.tokenizers[0], text_encoder=c.text_encoders[0], vae=c.vae,
                                           scheduler=c.scheduler, image_processor=c.extra.get("image_processor"),
                                           image_encoder=c.extra.get("image_encoder"), transformer=c.denoiser,
                                           transformer_2=c.extra.get("transformer_2"),
                                           boundary_ratio=c.extra.get("boundary_ratio"))
        return WanPipeline(tokenizer=c.tokenizers[0], text_encoder=c.text_encoders[0], vae=c.vae,
                           scheduler=c.scheduler, transformer=c.denoiser, transformer_2=c.extra.get("transformer_2"),
                           boundary_ratio=c.extra.get("boundary_ratio"))

    def sample_kwargs(self, pos, neg, scale):
        kw = {"prompt_embeds": pos["prompt_embeds"], "guidance_scale": scale}
        if neg is not None:
            kw["negative_prompt_embeds"] = neg["prompt_embeds"]
        return kw

    def experts(self, c: Components, which: str) -> dict[str, tuple[torch.nn.Module, float, float]]:
        """Module name -> (transformer, lowest sigma, highest sigma) it is trained on."""
        return {"transformer": (c.denoiser, 0.0, 1.0)}


class Wan22(Wan21):
    """Wan2.2 A14B: a high-noise and a low-noise expert, switched at ``boundary_ratio``."""

    name = "wan22"

    def separate_expert_files(self, parts, experts):
        """A14B's two experts: a file per expert trained (both, or the one ``train.experts`` names)."""
        return "transformer_2" in parts or experts != "both"

    def experts(self, c, which):
        t2 = c.extra.get("transformer_2")
        b = c.extra.get("boundary_ratio")
        if t2 is None or b is None:  # Wan2.2 TI2V 5B: one transformer
            return {"transformer": (c.denoiser, 0.0, 1.0)}
        both = {"transformer": (c.denoiser, float(b), 1.0), "transformer_2": (t2, 0.0, float(b))}
        if which == "high_noise":
            return {"transformer": both["transformer"]}
        if which == "low_noise":
            return {"transformer_2": both["transformer_2"]}
        return both

