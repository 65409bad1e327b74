"""HunyuanVideo 1.5 (Tencent): an 8.3B double-stream video DiT, captions read by Qwen2.5-VL-7B (and
ByT5 for quoted text), a 32-channel causal 3D VAE at 16x spatial and 4x temporal compression.

The second video family, chosen over LTX-2 because diffusers 0.42.1 trains it with the video path's
own shapes (text-to-video, one transformer, ``HunyuanVideo15Pipeline``), where LTX-2 is an audio + video
model (``LTX2Pipeline`` with an audio VAE, a vocoder and Gemma-3 connectors); users ask for both
(peers review Q6: diffusion-pipe#478 for HunyuanVideo 1.5; musubi-tuner trains it,
docs/hunyuan_video_1_5.md, the recipe below).

- Loading: ``HunyuanVideo15Pipeline`` (``HunyuanVideo15Transformer3DModel``,
  ``AutoencoderKLHunyuanVideo15``, ``Qwen2_5_VLTextModel`` + ``T5EncoderModel`` (ByT5), a CFG guider).
- Text: the pipeline's own ``encode_prompt`` (its system prompt, the template's first 108 tokens
  dropped, the third-to-last hidden state; ByT5 states of the quoted text or zeros), each caption
  cached with only its real tokens, padded per batch with masks.
- Latents: ``vae.encode(...).latent_dist.mode() * scaling_factor`` (the pipeline decodes
  ``latents / scaling_factor``).
- Objective: flow matching, target ``noise - x0``; the transformer takes ``sigma * 1000`` and, for
  text-to-video, the latents followed by zero condition latents and a zero mask channel, and zero
  vision states (``HunyuanVideo15Pipeline.prepare_cond_latents_and_mask`` and its ``image_embeds``).
- Targets: attention q/k/v/out of both streams and both feed-forwards of every block (musubi-tuner
  networks/lora_hv_1_5.py trains the blocks' linears).
- ComfyUI key rule: ComfyUI loads HunyuanVideo 1.5 as its HunyuanVideo model (comfy/model_base.py
  ``HunyuanVideo15(HunyuanVideo)``), whose blocks are FLUX's ``DoubleStreamBlock``
  (comfy/ldm/hunyuan_video/model.py: ``double_blocks.N.img_attn.qkv`` / ``img_mlp.0`` / ``txt_*``), and
  maps ``lora_unet_<path>`` onto them (comfy/lora.py, the generic rule); diffusers names its blocks
  as FLUX.1's double blocks, so the rule is FLUX.1's double-block rule. The fetchable ComfyUI is
  too large to bring here (1.2 GB): the model file was read through the code index at c828fdc.
- Recipe (musubi-tuner docs/hunyuan_video_1_5.md): shift 2.0, AdamW8bit lr 1e-4, rank 32, gradient
  checkpointing; up to 51 of the 54 blocks can be swapped.
"""

from __future__ import annotations

from typing import ClassVar

import torch

from lorapod.engine.diffusion.families.base import Components, Family, Rule
from lorapod.engine.diffusion.families.flux import FLUX1_RULES
from lorapod.engine.diffusion.families.textpad import masked_batch

KOHYA_RULES: tuple[Rule, ...] = tuple(r for r in FLUX1_RULES if r[0].startswith(r"transformer_blocks"))
SAMPLE_FPS = 24


class HunyuanVideo15(Family):
    name = "hunyuanvideo15"
    pipeline_class = "HunyuanVideo15Pipeline"
    denoiser_name = "transformer"
    flow = True
    video: ClassVar[bool] = True
    default_targets = (r"^transformer_blocks\.\d+\.(attn\.(to_q|to_k|to_v|to_out\.0|add_q_proj|add_k_proj|add_v_proj"
                       r"|to_add_out)|ff(_context)?\.net\.(0\.proj|2))$")
    kohya_rules = KOHYA_RULES
    block_lists = ("transformer_blocks",)
    sample_fps = SAMPLE_FPS
    # diffusers' names: FLUX.1's double blocks (their ff_context) without FLUX's single blocks; a file that has
    # only double-block attention is FLUX.1's or this family's, and inspect reads the metadata first
    inspect_signature = r"\A(?![\s\S]*single_transformer_blocks)(?=[\s\S]*transformer_blocks\.\d+\.ff_context\.)"
    comfy_unet = (r"double_blocks_\d+_(img|txt)_(attn_(qkv|proj)|mlp_[02]|mod_lin)")

    def lora_file_writer(self):
        """diffusers 0.42.1 gives HunyuanVideo15Pipeline no LoRA loader; HunyuanVideo's loader writes the same
        file (``transformer.<path>.lora_A/B`` + the adapter config), which the transformer's own
        ``load_lora_adapter(..., prefix="transformer")`` reads back."""
        from diffusers.loaders import HunyuanVideoLoraLoaderMixin

        return HunyuanVideoLoraLoaderMixin

    def components(self, pipe, model_id: str) -> Components:
        return Components(self, model_id, pipe.transformer, pipe.vae, [pipe.text_encoder, pipe.text_encoder_2],
                          [pipe.tokenizer, pipe.tokenizer_2], pipe.scheduler, extra={"guider": pipe.guider})

    def vae_spatial_factor(self, vae_config):
        return int(vae_config.get("spatial_compression_ratio", 16))

    def text_len(self, c: Components) -> int:
        return 1000 + 256  # the pipeline's tokenizer_max_length and tokenizer_2_max_length

    def pipeline(self, c):
        from diffusers import HunyuanVideo15Pipeline

        return HunyuanVideo15Pipeline(text_encoder=c.text_encoders[0], tokenizer=c.tokenizers[0],
                                      transformer=c.denoiser, vae=c.vae, scheduler=c.scheduler,
                                      text_encoder_2=c.text_encoders[1], tokenizer_2=c.tokenizers[1],
                                      guider=c.extra["guider"])

    def encode_text(self, c, captions, device):
        pe, mask, pe2, mask2 = self.pipeline(c).encode_prompt(list(captions), device=device, batch_size=len(captions),
                                                              dtype=c.text_encoders[0].dtype)
        return {"prompt_embeds": pe, "prompt_mask": mask.long(), "prompt_embeds_2": pe2,
                "prompt_mask_2": mask2.long()}

    def cache_text(self, enc, j):
        """One caption's real tokens of each encoder (the masks mark them; ByT5's may be none)."""
        n, n2 = int(enc["prompt_mask"][j].sum()), int(enc["prompt_mask_2"][j].sum())
        return {"prompt_embeds": enc["prompt_embeds"][j, :n], "prompt_embeds_2": enc["prompt_embeds_2"][j, :n2]}

    def collate_text(self, per):
        one = masked_batch([p["prompt_embeds"] for p in per])
        two = masked_batch([p["prompt_embeds_2"] for p in per])
        return {**one, "prompt_embeds_2": two["prompt_embeds"], "prompt_mask_2": two["prompt_mask"]}

    def encode_latents(self, c, pixels):
        """(B, 3, F, H, W) in [-1, 1] -> latents (B, 32, 1 + (F-1)/4, H/16, W/16) times the scaling factor."""
        vae = c.vae
        z = vae.encode(pixels.to(vae.device, vae.dtype)).latent_dist.mode()
        return z * vae.config.scaling_factor

    def forward(self, c, noisy, t, cond, meta, model=None):
        tr = model if model is not None else c.denoiser
        b, _ch, f, h, w = noisy.shape
        zeros = torch.zeros(b, _ch + 1, f, h, w, device=noisy.device, dtype=noisy.dtype)  # T2V: no condition
        vision = torch.zeros(b, 729, tr.config.image_embed_dim, device=noisy.device, dtype=noisy.dtype)
        return tr(hidden_states=torch.cat([noisy, zeros], dim=1), image_embeds=vision, timestep=t * 1000,
                  encoder_hidden_states=cond["prompt_embeds"].to(noisy.dtype),
                  encoder_attention_mask=cond["prompt_mask"],
                  encoder_hidden_states_2=cond["prompt_embeds_2"].to(noisy.dtype),
                  encoder_attention_mask_2=cond["prompt_mask_2"], return_dict=False)[0]

    def prepare_sampling(self, pipe, scale: float) -> None:
        """HunyuanVideo15Pipeline takes its guidance from its guider, not from a call argument."""
        pipe.guider.guidance_scale = scale

    def sample_kwargs(self, pos, neg, scale):
        kw = {"prompt_embeds": pos["prompt_embeds"], "prompt_embeds_mask": pos["prompt_mask"],
              "prompt_embeds_2": pos["prompt_embeds_2"], "prompt_embeds_mask_2": pos["prompt_mask_2"]}
        if neg is not None:
            kw |= {"negative_prompt_embeds": neg["prompt_embeds"], "negative_prompt_embeds_mask": neg["prompt_mask"],
                   "negative_prompt_embeds_2": neg["prompt_embeds_2"],
                   "negative_prompt_embeds_mask_2": neg["prompt_mask_2"]}
        return kw
