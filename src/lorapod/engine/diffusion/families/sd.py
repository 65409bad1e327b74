"""Stable Diffusion 1.5 and SDXL: U-Nets with CLIP text encoders, DDPM noise prediction."""

from __future__ import annotations

import torch

from lorapod.engine.diffusion.families.base import Components, Family


class SD15(Family):
    name = "sd15"
    pipeline_class = "StableDiffusionPipeline"
    # the attention and feed-forward layers of every transformer block (what kohya's LoRA trains)
    default_targets = ["to_q", "to_k", "to_v", "to_out.0", "proj_in", "proj_out", "ff.net.0.proj", "ff.net.2"]
    kohya_te_prefixes = ["lora_te"]
    kohya_rules = ()  # lora_unet_<diffusers path>: ComfyUI's unet_to_diffusers, A1111/Forge and diffusers map them

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
