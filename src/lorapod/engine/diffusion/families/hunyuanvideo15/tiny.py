"""A tiny random ``HunyuanVideo15Pipeline`` folder for the tests: the real classes at a few million
parameters (a 2-block ``HunyuanVideo15Transformer3DModel``, an ``AutoencoderKLHunyuanVideo15`` with 8
latent channels at 16x / 4x compression, a 3-layer ``Qwen2_5_VLTextModel``, a 1-layer ByT5 encoder with
transformers' own ``ByT5Tokenizer``, the byte-level test tokenizer, a CFG guider). Nothing is downloaded."""

from __future__ import annotations

from pathlib import Path


def build(out: Path, seed: int = 0) -> Path:
    import torch
    from diffusers import (
        AutoencoderKLHunyuanVideo15,
        FlowMatchEulerDiscreteScheduler,
        HunyuanVideo15Pipeline,
        HunyuanVideo15Transformer3DModel,
    )
    from diffusers.guiders import ClassifierFreeGuidance
    from transformers import (
        ByT5Tokenizer,
        Qwen2_5_VLTextConfig,
        Qwen2_5_VLTextModel,
        T5Config,
        T5EncoderModel,
    )

    from lorapod.builtin.sd import clip_tokenizer

    tok = clip_tokenizer(out / "tokenizer")
    tok.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    torch.manual_seed(seed)
    te = Qwen2_5_VLTextModel(Qwen2_5_VLTextConfig(
        vocab_size=len(tok), hidden_size=16, intermediate_size=32, num_hidden_layers=3, num_attention_heads=2,
        num_key_value_heads=1, max_position_embeddings=2048, rope_scaling={"type": "mrope", "mrope_section": [1, 1, 2]}))
    te2 = T5EncoderModel(T5Config(vocab_size=384, d_model=16, d_ff=32, d_kv=8, num_layers=1, num_heads=2))
    z = 8
    tr = HunyuanVideo15Transformer3DModel(in_channels=2 * z + 1, out_channels=z, num_attention_heads=2,
                                          attention_head_dim=16, num_layers=2, num_refiner_layers=1, text_embed_dim=16,
                                          text_embed_2_dim=16, image_embed_dim=16, rope_axes_dim=(4, 6, 6),
                                          task_type="t2v")
    vae = AutoencoderKLHunyuanVideo15(latent_channels=z, block_out_channels=(8, 8, 16, 16, 16), layers_per_block=1)
    pipe = HunyuanVideo15Pipeline(text_encoder=te, tokenizer=tok, transformer=tr, vae=vae,
                                  scheduler=FlowMatchEulerDiscreteScheduler(shift=5.0), text_encoder_2=te2,
                                  tokenizer_2=ByT5Tokenizer(), guider=ClassifierFreeGuidance(guidance_scale=6.0))
    pipe.save_pretrained(out)
    return out
