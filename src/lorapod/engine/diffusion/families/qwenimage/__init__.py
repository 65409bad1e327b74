"""Qwen-Image (Qwen): a 20B double-stream MMDiT, captions read by Qwen2.5-VL-7B, a VAE of its own.

Everything lorapod knows about training it, in one place (the facts are its row in
``catalog/families.py`` and ``catalog/data/models.yaml``):

- Loading: ``QwenImagePipeline`` (``QwenImageTransformer2DModel``, ``AutoencoderKLQwenImage``,
  ``Qwen2_5_VLForConditionalGeneration``).
- Text: the pipeline's own ``_get_qwen_prompt_embeds`` (its chat template, the template's first
  tokens dropped, the last hidden state), each caption its own length, padded per batch with a mask.
- Latents: the VAE's 5-D latents of one frame, normalised ``(z - latents_mean) / latents_std`` with
  the config's per-channel lists (diffusers' examples/dreambooth/train_dreambooth_lora_qwen_image.py:
  ``(model_input - latents_mean) * (1 / latents_std)``), kept as (C, H, W).
- Objective: flow matching, target ``noise - x0``; the transformer takes sigma itself (the script's
  ``timestep=timesteps / 1000``) on 2x2-packed tokens (``QwenImagePipeline._pack_latents``) with
  ``img_shapes`` for its RoPE.
- Targets: every linear of the blocks but the modulation (musubi-tuner's networks/lora_qwen_image.py
  excludes "_mod_"): attention q/k/v/out for both streams and both MLPs.
- ComfyUI key rule (``KOHYA_RULES`` empty: the diffusers paths as they are): ComfyUI's own Qwen-Image
  model (comfy/ldm/qwen_image/model.py) names its blocks as diffusers does
  (``transformer_blocks.N.attn.to_q`` / ``add_q_proj`` / ``to_add_out``, ``img_mlp.net.0.proj``),
  and comfy/lora.py maps ``lora_unet_<path>`` (the generic rule) and ``transformer.<path>``
  (its QwenImage branch) onto it.
- Block swap: the ``transformer_blocks`` (engine/diffusion/memory.py); the 20B transformer on a
  24 GB card needs fp8 and about 16 swapped blocks (musubi-tuner docs/qwen_image.md).
"""

from __future__ import annotations

import torch

from lorapod.engine.diffusion.families.base import Components, Family, Rule
from lorapod.engine.diffusion.families.textpad import collate_masked

KOHYA_RULES: tuple[Rule, ...] = ()


class QwenImage(Family):
    name = "qwenimage"
    pipeline_class = "QwenImagePipeline"
    denoiser_name = "transformer"
    flow = True
    default_targets = (r"^transformer_blocks\.\d+\.(attn\.(to_q|to_k|to_v|to_out\.0|add_q_proj|add_k_proj|add_v_proj"
                       r"|to_add_out)|(img|txt)_mlp\.net\.(0\.proj|2))$")
    kohya_rules = KOHYA_RULES
    block_lists = ("transformer_blocks",)
    inspect_signature = r"(^|\.|_)transformer_blocks[._]\d+[._](img|txt)_(mlp|mod)"
    # comfy/ldm/qwen_image/model.py: the blocks' Linear layers and the model's own
    comfy_unet = (r"transformer_blocks_\d+_(attn_(to_[qkv]|to_out_0|add_[qkv]_proj|to_add_out)"
                  r"|(img|txt)_mlp_net_(0_proj|2)|(img|txt)_mod_1)|img_in|txt_in|proj_out|norm_out_linear"
                  r"|time_text_embed_timestep_embedder_linear_[12]")
    comfy_takes_diffusers = True  # comfy/lora.py's QwenImage branch: key_map["transformer.{}"]

    def components(self, pipe, model_id: str) -> Components:
        return Components(self, model_id, pipe.transformer, pipe.vae, [pipe.text_encoder], [pipe.tokenizer],
                          pipe.scheduler)

    def pipeline(self, c):
        from diffusers import QwenImagePipeline

        return QwenImagePipeline(scheduler=c.scheduler, vae=c.vae, text_encoder=c.text_encoders[0],
                                 tokenizer=c.tokenizers[0], transformer=c.denoiser)

    def encode_text(self, c, captions, device):
        embeds, mask = self.pipeline(c)._get_qwen_prompt_embeds(list(captions), device)
        return {"prompt_embeds": embeds, "prompt_mask": mask.long()}

    def collate_text(self, per):
        return collate_masked(per)

    def encode_latents(self, c, pixels):
        """(B, 3, H, W) in [-1, 1] -> normalised latents (B, z, H/8, W/8) (one frame of the 3-D VAE)."""
        vae = c.vae
        z = vae.encode(pixels.unsqueeze(2).to(vae.device, vae.dtype)).latent_dist.mode()
        mean = torch.tensor(vae.config.latents_mean, device=z.device, dtype=z.dtype).view(1, -1, 1, 1, 1)
        std = torch.tensor(vae.config.latents_std, device=z.device, dtype=z.dtype).view(1, -1, 1, 1, 1)
        return ((z - mean) / std).squeeze(2)

    def forward(self, c, noisy, t, cond, meta):
        from diffusers import QwenImagePipeline as P

        b, ch, h, w = noisy.shape
        mask = cond["prompt_mask"]
        out = c.denoiser(hidden_states=P._pack_latents(noisy, b, ch, h, w),
                         encoder_hidden_states=cond["prompt_embeds"].to(noisy.dtype),
                         encoder_hidden_states_mask=None if bool(mask.all()) else mask, timestep=t,
                         img_shapes=[(1, h // 2, w // 2)] * b, return_dict=False)[0]
        return out.view(b, h // 2, w // 2, ch, 2, 2).permute(0, 3, 1, 4, 2, 5).reshape(b, ch, h, w)

    def sample_kwargs(self, pos, neg, scale):
        """QwenImagePipeline's true CFG: ``true_cfg_scale`` with a negative prompt (its default 4.0)."""
        kw = {"prompt_embeds": pos["prompt_embeds"], "prompt_embeds_mask": pos["prompt_mask"]}
        if neg is not None and scale > 1:
            kw |= {"negative_prompt_embeds": neg["prompt_embeds"], "negative_prompt_embeds_mask": neg["prompt_mask"],
                   "true_cfg_scale": scale}
        return kw
