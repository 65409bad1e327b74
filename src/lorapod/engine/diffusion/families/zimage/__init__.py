"""Z-Image (Tongyi-MAI): a single-stream DiT on FLUX.1's VAE, captions read by Qwen3-4B.

Everything lorapod knows about training it, in one place (the facts are its row in
``catalog/families.py`` and ``catalog/data/models.yaml``):

- Loading: ``ZImagePipeline`` (``ZImageTransformer2DModel``, ``AutoencoderKL``, ``Qwen3Model``).
- Text: the pipeline's own ``_encode_prompt`` (the chat template, the second-to-last hidden state,
  the padding dropped: each caption keeps its own length), padded per batch with a mask.
- Latents: FLUX.1's VAE, ``(z - shift_factor) * scaling_factor`` (diffusers'
  examples/dreambooth/train_dreambooth_lora_z_image.py, the reference the tests compare against).
- Objective: flow matching, target ``noise - x0``; the transformer takes ``1 - sigma`` and predicts
  the negated velocity (the script's ``timestep_normalized = (1000 - timesteps) / 1000`` and
  ``model_pred = -model_pred``; ZImagePipeline samples the same way).
- Targets: every linear of the 30 main layers (attention q/k/v/out, the SwiGLU w1/w2/w3); not the
  modulation or the refiners (musubi-tuner's networks/lora_zimage.py excludes "_modulation|_refiner").
- ComfyUI key rule (``KOHYA_RULES``): ComfyUI loads Z-Image as Lumina's NextDiT
  (comfy/ldm/lumina/model.py: ``layers.N.attention.qkv`` fused, ``attention.out``,
  ``feed_forward.w1/w2/w3``) and maps ``lora_unet_<its module path>`` onto it
  (comfy/lora.py ``model_lora_keys_unet``, the generic rule for every diffusion model); q, k and v
  are stacked into ``qkv`` as sd-scripts stacks FLUX's.
- Block swap: the ``layers`` (engine/diffusion/memory.py).
"""

from __future__ import annotations

import torch

from lorapod.engine.diffusion.families.base import Components, Family, Rule
from lorapod.engine.diffusion.families.textpad import collate_masked, masked_batch

_BLOCKS = r"(layers|noise_refiner|context_refiner)"
KOHYA_RULES: tuple[Rule, ...] = (
    (rf"{_BLOCKS}\.(\d+)\.attention\.to_q", "{0}.{1}.attention.qkv", 0, 3),
    (rf"{_BLOCKS}\.(\d+)\.attention\.to_k", "{0}.{1}.attention.qkv", 1, 3),
    (rf"{_BLOCKS}\.(\d+)\.attention\.to_v", "{0}.{1}.attention.qkv", 2, 3),
    (rf"{_BLOCKS}\.(\d+)\.attention\.to_out\.0", "{0}.{1}.attention.out", 0, 1),
    (rf"{_BLOCKS}\.(\d+)\.feed_forward\.(w[123])", "{0}.{1}.feed_forward.{2}", 0, 1),
)


class ZImage(Family):
    name = "zimage"
    pipeline_class = "ZImagePipeline"
    denoiser_name = "transformer"
    flow = True
    default_targets = r"^layers\.\d+\.(attention\.(to_q|to_k|to_v|to_out\.0)|feed_forward\.w[123])$"
    kohya_rules = KOHYA_RULES
    block_lists = ("layers",)
    # diffusers' names (layers.N.attention.to_q / feed_forward.w1) or ComfyUI's (layers_N_attention_qkv)
    inspect_signature = r"^(transformer\.|lora_unet_)?(layers|noise_refiner|context_refiner)[._]\d+[._](attention|feed_forward)"
    # comfy/ldm/lumina/model.py NextDiT: the Linear layers of its blocks, the embedders and the final layer
    comfy_unet = (r"(layers|noise_refiner|context_refiner)_\d+_(attention_(qkv|out)|feed_forward_w[123]"
                  r"|adaLN_modulation_[01])|x_embedder|cap_embedder_1|t_embedder_mlp_[02]"
                  r"|final_layer_(linear|adaLN_modulation_1)")
    # musubi-tuner's own Z-Image LoRA (networks/lora_zimage.py) keeps to_q/k/v apart; ComfyUI fuses them
    comfy_refused = ((r"(layers|noise_refiner|context_refiner)_\d+_attention_(to_[qkv]|to_out_0)",
                      "musubi-tuner's Z-Image layout (separate to_q/k/v): ComfyUI's model fuses them in "
                      "attention.qkv; convert with musubi's networks/convert_z_image_lora_to_comfy.py"),)

    def components(self, pipe, model_id: str) -> Components:
        return Components(self, model_id, pipe.transformer, pipe.vae, [pipe.text_encoder], [pipe.tokenizer],
                          pipe.scheduler)

    def text_pipeline(self, c: Components):
        from diffusers import ZImagePipeline

        return ZImagePipeline(scheduler=c.scheduler, vae=c.vae, text_encoder=c.text_encoders[0],
                              tokenizer=c.tokenizers[0], transformer=c.denoiser)

    def encode_text(self, c, captions, device):
        tok = c.tokenizers[0]
        n = min(512, tok.model_max_length)  # ZImagePipeline's max_sequence_length
        states = self.text_pipeline(c)._encode_prompt(list(captions), device=device, max_sequence_length=n)
        return masked_batch(states)

    def collate_text(self, per):
        return collate_masked(per)

    def forward(self, c, noisy, t, cond, meta):
        states = [s[: int(m.sum())].to(noisy.dtype) for s, m in zip(cond["prompt_embeds"], cond["prompt_mask"],
                                                                     strict=True)]
        out = c.denoiser(list(noisy.unsqueeze(2).unbind(0)), 1 - t, states, return_dict=False)[0]
        return -torch.stack(out).squeeze(2)

    def pipeline(self, c):
        return self.text_pipeline(c)

    def sample_kwargs(self, pos, neg, scale):
        kw = {"prompt_embeds": _unpad(pos), "guidance_scale": scale}
        if neg is not None and scale > 1:
            kw["negative_prompt_embeds"] = _unpad(neg)
        return kw


def _unpad(d: dict[str, torch.Tensor]) -> list[torch.Tensor]:
    return [s[: int(m.sum())] for s, m in zip(d["prompt_embeds"], d["prompt_mask"], strict=True)]
