"""The tiny Wan2.1 / Wan2.2 pipelines the video demo and tests build in code (random
``WanTransformer3DModel``, ``AutoencoderKLWan`` and umT5 encoder, the byte-level tokenizer of
``builtin.sd``), saved as local diffusers folders: nothing is downloaded."""

from __future__ import annotations

from pathlib import Path

from lorapod.builtin.sd import clip_tokenizer


def tiny_wan_transformer(seed: int = 0, z_dim: int = 4, text_dim: int = 32, layers: int = 2,
                         i2v: bool = False, image_dim: int | None = None):
    """I2V: the input also holds the 4 mask channels and the first-frame latents; ``image_dim``
    (Wan2.1 I2V) adds the CLIP image keys/values to the cross-attention."""
    import torch
    from diffusers import WanTransformer3DModel

    torch.manual_seed(seed)
    return WanTransformer3DModel(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=12,
                                 in_channels=2 * z_dim + 4 if i2v else z_dim, out_channels=z_dim, text_dim=text_dim,
                                 freq_dim=32, ffn_dim=32, num_layers=layers, rope_max_seq_len=32, image_dim=image_dim,
                                 added_kv_proj_dim=24 if image_dim else None)


def tiny_wan_vae(seed: int = 0, z_dim: int = 4):
    import torch
    from diffusers import AutoencoderKLWan

    torch.manual_seed(seed)
    return AutoencoderKLWan(base_dim=8, z_dim=z_dim, dim_mult=[1, 1, 1, 1], num_res_blocks=1,
                            temperal_downsample=[False, True, True], latents_mean=[0.1 * i for i in range(z_dim)],
                            latents_std=[1.0 + 0.1 * i for i in range(z_dim)])


def build_wan(out: Path, family: str = "wan21", seed: int = 0, i2v: bool = False) -> Path:
    """A tiny WanPipeline folder; ``wan22`` adds a low-noise ``transformer_2`` and boundary_ratio 0.875;
    ``i2v`` makes it a WanImageToVideoPipeline (Wan2.1: with a tiny CLIP vision encoder)."""
    import torch
    from diffusers import UniPCMultistepScheduler, WanImageToVideoPipeline, WanPipeline
    from transformers import (
        CLIPImageProcessor,
        CLIPVisionConfig,
        CLIPVisionModel,
        UMT5Config,
        UMT5EncoderModel,
    )

    tok = clip_tokenizer(out / "tokenizer")
    torch.manual_seed(seed)
    te = UMT5EncoderModel(UMT5Config(vocab_size=len(tok), d_model=32, d_kv=8, d_ff=37, num_layers=2, num_heads=4,
                                     relative_attention_num_buckets=8, pad_token_id=len(tok) - 1))
    sched = UniPCMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True, num_train_timesteps=1000,
                                    flow_shift=3.0)
    two = family == "wan22"
    clip = i2v and not two  # Wan2.1 I2V conditions on CLIP image states too; Wan2.2 I2V does not
    kw = {"i2v": i2v, "image_dim": 16 if clip else None}
    parts = {"tokenizer": tok, "text_encoder": te, "vae": tiny_wan_vae(seed), "scheduler": sched,
             "transformer": tiny_wan_transformer(seed, **kw),
             "transformer_2": tiny_wan_transformer(seed + 1, **kw) if two else None,
             "boundary_ratio": 0.875 if two else None}
    if i2v:
        enc = CLIPVisionModel(CLIPVisionConfig(hidden_size=16, intermediate_size=37, num_hidden_layers=2,
                                               num_attention_heads=2, image_size=32, patch_size=8)) if clip else None
        proc = CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32}) if clip else None
        pipe = WanImageToVideoPipeline(**parts, image_encoder=enc, image_processor=proc)
    else:
        pipe = WanPipeline(**parts)
    pipe.save_pretrained(out)
    return out
