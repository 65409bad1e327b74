"""FLUX.1 and FLUX.2 klein: flow-matching diffusion transformers on 2x2-patch latent tokens."""

from __future__ import annotations

import torch

from lorapod.engine.diffusion.families.base import Components, Family, Rule

# The kohya (ComfyUI / Forge ``lora_unet_``) layout: sd-scripts' names on the original (BFL) modules,
# which ComfyUI and Forge map for every model and diffusers converts (``_convert_kohya_flux*``). Where
# BFL fuses layers that diffusers keeps apart (q, k, v -> ``qkv``; FLUX.1's single-block q, k, v and
# MLP -> ``linear1``) the parts are stacked (export/kohya.py).
_FLUX_DOUBLE_ATTN: list[Rule] = [
    (r"transformer_blocks\.(\d+)\.attn\.to_q", "double_blocks.{0}.img_attn.qkv", 0, 3),
    (r"transformer_blocks\.(\d+)\.attn\.to_k", "double_blocks.{0}.img_attn.qkv", 1, 3),
    (r"transformer_blocks\.(\d+)\.attn\.to_v", "double_blocks.{0}.img_attn.qkv", 2, 3),
    (r"transformer_blocks\.(\d+)\.attn\.add_q_proj", "double_blocks.{0}.txt_attn.qkv", 0, 3),
    (r"transformer_blocks\.(\d+)\.attn\.add_k_proj", "double_blocks.{0}.txt_attn.qkv", 1, 3),
    (r"transformer_blocks\.(\d+)\.attn\.add_v_proj", "double_blocks.{0}.txt_attn.qkv", 2, 3),
    (r"transformer_blocks\.(\d+)\.attn\.to_out\.0", "double_blocks.{0}.img_attn.proj", 0, 1),
    (r"transformer_blocks\.(\d+)\.attn\.to_add_out", "double_blocks.{0}.txt_attn.proj", 0, 1),
    (r"x_embedder", "img_in", 0, 1),
    (r"context_embedder", "txt_in", 0, 1),
    (r"proj_out", "final_layer.linear", 0, 1),
]

FLUX1_RULES: list[Rule] = [
    *_FLUX_DOUBLE_ATTN,
    (r"transformer_blocks\.(\d+)\.ff\.net\.0\.proj", "double_blocks.{0}.img_mlp.0", 0, 1),
    (r"transformer_blocks\.(\d+)\.ff\.net\.2", "double_blocks.{0}.img_mlp.2", 0, 1),
    (r"transformer_blocks\.(\d+)\.ff_context\.net\.0\.proj", "double_blocks.{0}.txt_mlp.0", 0, 1),
    (r"transformer_blocks\.(\d+)\.ff_context\.net\.2", "double_blocks.{0}.txt_mlp.2", 0, 1),
    (r"transformer_blocks\.(\d+)\.norm1\.linear", "double_blocks.{0}.img_mod.lin", 0, 1),
    (r"transformer_blocks\.(\d+)\.norm1_context\.linear", "double_blocks.{0}.txt_mod.lin", 0, 1),
    (r"single_transformer_blocks\.(\d+)\.attn\.to_q", "single_blocks.{0}.linear1", 0, 4),
    (r"single_transformer_blocks\.(\d+)\.attn\.to_k", "single_blocks.{0}.linear1", 1, 4),
    (r"single_transformer_blocks\.(\d+)\.attn\.to_v", "single_blocks.{0}.linear1", 2, 4),
    (r"single_transformer_blocks\.(\d+)\.proj_mlp", "single_blocks.{0}.linear1", 3, 4),
    (r"single_transformer_blocks\.(\d+)\.proj_out", "single_blocks.{0}.linear2", 0, 1),
    (r"single_transformer_blocks\.(\d+)\.norm\.linear", "single_blocks.{0}.modulation.lin", 0, 1),
    (r"time_text_embed\.timestep_embedder\.linear_1", "time_in.in_layer", 0, 1),
    (r"time_text_embed\.timestep_embedder\.linear_2", "time_in.out_layer", 0, 1),
    (r"time_text_embed\.guidance_embedder\.linear_1", "guidance_in.in_layer", 0, 1),
    (r"time_text_embed\.guidance_embedder\.linear_2", "guidance_in.out_layer", 0, 1),
    (r"time_text_embed\.text_embedder\.linear_1", "vector_in.in_layer", 0, 1),
    (r"time_text_embed\.text_embedder\.linear_2", "vector_in.out_layer", 0, 1),
]

FLUX2_RULES: list[Rule] = [
    *_FLUX_DOUBLE_ATTN,
    (r"transformer_blocks\.(\d+)\.ff\.linear_in", "double_blocks.{0}.img_mlp.0", 0, 1),
    (r"transformer_blocks\.(\d+)\.ff\.linear_out", "double_blocks.{0}.img_mlp.2", 0, 1),
    (r"transformer_blocks\.(\d+)\.ff_context\.linear_in", "double_blocks.{0}.txt_mlp.0", 0, 1),
    (r"transformer_blocks\.(\d+)\.ff_context\.linear_out", "double_blocks.{0}.txt_mlp.2", 0, 1),
    (r"single_transformer_blocks\.(\d+)\.attn\.to_qkv_mlp_proj", "single_blocks.{0}.linear1", 0, 1),
    (r"single_transformer_blocks\.(\d+)\.attn\.to_out", "single_blocks.{0}.linear2", 0, 1),
    (r"time_guidance_embed\.timestep_embedder\.linear_1", "time_in.in_layer", 0, 1),
    (r"time_guidance_embed\.timestep_embedder\.linear_2", "time_in.out_layer", 0, 1),
]


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
    kohya_rules = tuple(FLUX1_RULES)
    pipeline_class = "FluxPipeline"
    denoiser_name = "transformer"
    flow = True
    # diffusers' own Flux LoRA script targets, plus the single blocks' MLP input
    default_targets = ["attn.to_q", "attn.to_k", "attn.to_v", "attn.to_out.0", "attn.add_q_proj", "attn.add_k_proj",
                       "attn.add_v_proj", "attn.to_add_out", "ff.net.0.proj", "ff.net.2", "ff_context.net.0.proj",
                       "ff_context.net.2", "proj_mlp"]

    block_lists = ("transformer_blocks", "single_transformer_blocks")

    def components(self, pipe, model_id):
        return Components(self, model_id, pipe.transformer, pipe.vae, [pipe.text_encoder, pipe.text_encoder_2],
                          [pipe.tokenizer, pipe.tokenizer_2], pipe.scheduler)

    def default_sample_steps(self, c):
        """FLUX.1 [schnell] (no guidance embedding) is distilled for 4 steps; [dev] samples in 28."""
        return self.sample_steps if c.denoiser.config.get("guidance_embeds", True) else 4

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
    kohya_rules = tuple(FLUX2_RULES)
    pipeline_class = "Flux2KleinPipeline"
    denoiser_name = "transformer"
    flow = True
    default_targets = (r".*(\.to_q|\.to_k|\.to_v|\.to_out\.0|\.add_q_proj|\.add_k_proj|\.add_v_proj|\.to_add_out"
                       r"|\.to_qkv_mlp_proj|single_transformer_blocks\.\d+\.attn\.to_out)$")
    block_lists = ("transformer_blocks", "single_transformer_blocks")

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
