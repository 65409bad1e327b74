"""A tiny random ``QwenImagePipeline`` folder for the tests: the real classes at a few hundred
thousand parameters (a 2-block ``QwenImageTransformer2DModel``, an ``AutoencoderKLQwenImage`` with 4
latent channels, a 2-layer ``Qwen2_5_VLForConditionalGeneration``, the byte-level test tokenizer) and
Qwen-Image's own scheduler config (dynamic shift). Nothing is downloaded."""

from __future__ import annotations

from pathlib import Path


def build(out: Path, seed: int = 0) -> Path:
    import torch
    from diffusers import (
        AutoencoderKLQwenImage,
        FlowMatchEulerDiscreteScheduler,
        QwenImagePipeline,
        QwenImageTransformer2DModel,
    )
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    from lorapod.builtin.sd import clip_tokenizer

    tok = clip_tokenizer(out / "tokenizer")
    tok.model_max_length = 256
    torch.manual_seed(seed)
    z = 4
    te = Qwen2_5_VLForConditionalGeneration(Qwen2_5_VLConfig(
        text_config={"vocab_size": len(tok), "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 2,
                     "num_attention_heads": 2, "num_key_value_heads": 1, "max_position_embeddings": 2048,
                     "rope_scaling": {"type": "mrope", "mrope_section": [1, 1, 2]}, "bos_token_id": None,
                     "eos_token_id": None},
        vision_config={"depth": 1, "hidden_size": 16, "out_hidden_size": 16, "intermediate_size": 32, "num_heads": 2,
                       "fullatt_block_indexes": [0]}))
    tr = QwenImageTransformer2DModel(patch_size=2, in_channels=4 * z, out_channels=z, num_layers=2,
                                     attention_head_dim=16, num_attention_heads=2, joint_attention_dim=16,
                                     axes_dims_rope=(4, 6, 6))
    vae = AutoencoderKLQwenImage(base_dim=8, z_dim=z, dim_mult=[1, 1, 1, 1], num_res_blocks=1,
                                 temperal_downsample=[False, True, True], latents_mean=[0.1 * i for i in range(z)],
                                 latents_std=[1.0 + 0.1 * i for i in range(z)])
    # Qwen/Qwen-Image's scheduler/scheduler_config.json
    sched = FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=1.0, use_dynamic_shifting=True,
                                            base_shift=0.5, max_shift=0.9, base_image_seq_len=256,
                                            max_image_seq_len=8192, shift_terminal=0.02, time_shift_type="exponential")
    QwenImagePipeline(scheduler=sched, vae=vae, text_encoder=te, tokenizer=tok, transformer=tr).save_pretrained(out)
    return out
