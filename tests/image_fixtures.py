"""Tiny random diffusion pipelines built from configs and saved as local diffusers folders.

Nothing is downloaded: the CLIP tokenizer is a byte-level BPE written by the test itself
(vocab.json + merges.txt), the models are random and a few thousand parameters each, so the
real loading code (``from_pretrained`` on a folder) runs in every test in well under a second.
"""

from __future__ import annotations

from pathlib import Path

from lorapod.demo_image import build_sd15, clip_text_model, clip_tokenizer, tiny_vae, write_images

__all__ = ["build_flux1", "build_flux2_klein", "build_sd15", "build_sdxl", "image_spec", "write_images"]



def build_sdxl(out: Path, seed: int = 0) -> Path:
    import torch
    from diffusers import EulerDiscreteScheduler, StableDiffusionXLPipeline, UNet2DConditionModel

    tok = clip_tokenizer(out / "tokenizer")
    torch.manual_seed(seed)
    unet = UNet2DConditionModel(block_out_channels=(32, 64), layers_per_block=1, sample_size=16, in_channels=4,
                                out_channels=4, down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
                                up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"), cross_attention_dim=64,
                                norm_num_groups=8, attention_head_dim=(2, 4), use_linear_projection=True,
                                addition_embed_type="text_time", addition_time_embed_dim=8,
                                transformer_layers_per_block=(1, 2), projection_class_embeddings_input_dim=80)
    sched = EulerDiscreteScheduler(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear",
                                   timestep_spacing="leading", steps_offset=1)
    pipe = StableDiffusionXLPipeline(unet=unet, vae=tiny_vae(seed), scheduler=sched,
                                     text_encoder=clip_text_model(len(tok), False, seed=seed), tokenizer=tok,
                                     text_encoder_2=clip_text_model(len(tok), True, seed=seed + 1), tokenizer_2=tok)
    pipe.save_pretrained(out)
    return out




def image_spec(model_dir: Path, data: Path, out: Path, family: str, **train) -> dict:
    t = {"epochs": 2, "micro_batch_size": 2, "grad_accum": 1, "learning_rate": 5e-3, "seed": 0,
         "scheduler": "constant", "precision": "fp32"}
    t.update(train)
    return {
        "model": {"id": str(model_dir), "family": family},
        "method": {"r": 4, "alpha": 8, "dropout": 0.0},
        "data": {"path": str(data), "format": "images", "resolution": 64, "trigger": "zxq"},
        "train": t,
        "eval": {"max_batches": 1},
        "save": {"every_epochs": 1, "keep_last": 10},
        "output": {"dir": str(out), "name": "t"},
    }


def _scheduler_flow(shift: float = 3.0):
    from diffusers import FlowMatchEulerDiscreteScheduler

    return FlowMatchEulerDiscreteScheduler(shift=shift, use_dynamic_shifting=False)


def build_flux1(out: Path, seed: int = 0) -> Path:
    """A tiny FluxPipeline: CLIP + a tiny T5 encoder (sharing the test BPE tokenizer), guidance embedding on."""
    import torch
    from diffusers import FluxPipeline, FluxTransformer2DModel
    from transformers import T5Config, T5EncoderModel

    tok = clip_tokenizer(out / "tokenizer")
    torch.manual_seed(seed)
    t5 = T5EncoderModel(T5Config(vocab_size=len(tok), d_model=32, d_ff=37, d_kv=8, num_layers=1, num_heads=4,
                                 pad_token_id=len(tok) - 1, eos_token_id=len(tok) - 1, decoder_start_token_id=0))
    tr = FluxTransformer2DModel(patch_size=1, in_channels=16, num_layers=1, num_single_layers=1, attention_head_dim=8,
                                num_attention_heads=2, joint_attention_dim=32, pooled_projection_dim=32,
                                guidance_embeds=True, axes_dims_rope=(2, 2, 4))
    vae = tiny_vae(seed, latent_channels=4, shift_factor=0.1, scaling_factor=0.4, use_quant_conv=False,
               use_post_quant_conv=False)
    pipe = FluxPipeline(scheduler=_scheduler_flow(), vae=vae, text_encoder=clip_text_model(len(tok), False, seed=seed),
                        tokenizer=tok, text_encoder_2=t5, tokenizer_2=tok, transformer=tr)
    pipe.save_pretrained(out)
    return out


def build_flux2_klein(out: Path, seed: int = 0) -> Path:
    """A tiny Flux2KleinPipeline: Qwen3 text encoder (3 layers), Flux2 VAE with batch-norm stats, no guidance embed."""
    import torch
    from diffusers import AutoencoderKLFlux2, Flux2KleinPipeline, Flux2Transformer2DModel
    from transformers import Qwen3Config, Qwen3ForCausalLM

    tok = clip_tokenizer(out / "tokenizer")
    tok.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    torch.manual_seed(seed)
    te = Qwen3ForCausalLM(Qwen3Config(vocab_size=len(tok), hidden_size=16, intermediate_size=32, num_hidden_layers=3,
                                      num_attention_heads=2, num_key_value_heads=1, head_dim=8,
                                      max_position_embeddings=64, tie_word_embeddings=True))
    tr = Flux2Transformer2DModel(patch_size=1, in_channels=16, num_layers=1, num_single_layers=1, attention_head_dim=8,
                                 num_attention_heads=2, joint_attention_dim=48, timestep_guidance_channels=16,
                                 axes_dims_rope=(2, 2, 2, 2), guidance_embeds=False)
    vae = AutoencoderKLFlux2(block_out_channels=(8, 16, 16), down_block_types=("DownEncoderBlock2D",) * 3,
                             up_block_types=("UpDecoderBlock2D",) * 3, layers_per_block=1, latent_channels=4,
                             norm_num_groups=8, sample_size=32)
    pipe = Flux2KleinPipeline(scheduler=_scheduler_flow(), vae=vae, text_encoder=te, tokenizer=tok, transformer=tr)
    pipe.save_pretrained(out)
    return out


def train_cpu(spec, run, tmp_path, **kw):
    """lorapod's diffusion engine on CPU, quietly, with its latent cache under ``tmp_path``."""
    from lorapod.engine.diffusion import train_diffusion

    return train_diffusion(spec, run, device="cpu", show_progress=False, log=lambda m: None,
                           cache_root=tmp_path / "cache", **kw)


class Crash(Exception):
    """Raised from a step hook to stand for a machine that dies mid-run."""
