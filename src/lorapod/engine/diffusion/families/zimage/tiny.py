"""A tiny random ``ZImagePipeline`` folder for the tests: the real classes at a few hundred thousand
parameters (a 2-layer ``ZImageTransformer2DModel``, FLUX.1's ``AutoencoderKL`` shape with 16 latent
channels, a 2-layer ``Qwen3Model``, the byte-level test tokenizer). Nothing is downloaded."""

from __future__ import annotations

from pathlib import Path


def build(out: Path, seed: int = 0) -> Path:
    import torch
    from diffusers import FlowMatchEulerDiscreteScheduler, ZImagePipeline, ZImageTransformer2DModel
    from transformers import Qwen3Config, Qwen3Model

    from lorapod.builtin.sd import clip_tokenizer, tiny_vae

    tok = clip_tokenizer(out / "tokenizer")
    tok.model_max_length = 64
    tok.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    torch.manual_seed(seed)
    te = Qwen3Model(Qwen3Config(vocab_size=len(tok), hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                num_attention_heads=2, num_key_value_heads=1, head_dim=8, max_position_embeddings=128))
    tr = ZImageTransformer2DModel(in_channels=16, dim=32, n_layers=2, n_refiner_layers=1, n_heads=2, n_kv_heads=2,
                                  cap_feat_dim=16, axes_dims=[4, 6, 6], axes_lens=[64, 32, 32])
    # FLUX.1's VAE config keys (shift and scale factors, no quant convs), 16 latent channels
    vae = tiny_vae(seed, latent_channels=16, shift_factor=0.1159, scaling_factor=0.3611, use_quant_conv=False,
                   use_post_quant_conv=False)
    sched = FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=3.0, use_dynamic_shifting=False)
    ZImagePipeline(scheduler=sched, vae=vae, text_encoder=te, tokenizer=tok, transformer=tr).save_pretrained(out)
    return out
