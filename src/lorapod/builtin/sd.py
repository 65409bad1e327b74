"""The tiny Stable-Diffusion-family pipelines the demos and tests build in code (SD 1.5, SDXL, FLUX.1,
FLUX.2 klein), saved as local diffusers folders.

Nothing is downloaded: the CLIP tokenizer is a byte-level BPE written here (vocab.json +
merges.txt) and the models are random and a few thousand parameters each, so the real loading
code (``from_pretrained`` on a folder) runs in well under a second.
"""

from __future__ import annotations

import json
from pathlib import Path

WORDS = ["a", "photo", "of", "zxq", "mug", "red", "blue", "square", "circle", "on", "table", "in", "the",
         "park", "green", "background", "style", "drawing", "cat", "dog"]


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character table (the CLIP/BPE alphabet)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, [chr(c) for c in cs], strict=True))


def clip_tokenizer(out: Path):
    """A CLIPTokenizer whose vocabulary is the byte alphabet plus a few whole words."""
    from transformers import CLIPTokenizer

    out.mkdir(parents=True, exist_ok=True)
    vocab: dict[str, int] = {}
    for ch in bytes_to_unicode().values():
        vocab.setdefault(ch, len(vocab))
        vocab.setdefault(ch + "</w>", len(vocab))
    merges: list[str] = []
    for w in WORDS:
        # merge left to right into the whole word (with its end-of-word marker)
        pieces = [*w[:-1], w[-1] + "</w>"]
        while len(pieces) > 1:
            a, b = pieces[0], pieces[1]
            merges.append(f"{a} {b}")
            vocab.setdefault(a + b, len(vocab))
            pieces = [a + b, *pieces[2:]]
    for special in ("<|startoftext|>", "<|endoftext|>"):
        vocab.setdefault(special, len(vocab))
    (out / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")
    merges = list(dict.fromkeys(merges))
    (out / "merges.txt").write_text("#version: 0.2\n" + "\n".join(merges) + "\n", encoding="utf-8")
    tok = CLIPTokenizer(str(out / "vocab.json"), str(out / "merges.txt"), model_max_length=16)
    return tok


def clip_text_model(vocab_size: int, projection: bool, hidden: int = 32, seed: int = 0):
    import torch
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection

    torch.manual_seed(seed)
    cfg = CLIPTextConfig(vocab_size=vocab_size, hidden_size=hidden, intermediate_size=37, num_hidden_layers=2,
                         num_attention_heads=4, max_position_embeddings=16, projection_dim=hidden,
                         bos_token_id=vocab_size - 2, eos_token_id=vocab_size - 1, pad_token_id=vocab_size - 1)
    return (CLIPTextModelWithProjection if projection else CLIPTextModel)(cfg)


def tiny_vae(seed: int = 0, latent_channels: int = 4, **kw):
    import torch
    from diffusers import AutoencoderKL

    torch.manual_seed(seed)
    return AutoencoderKL(block_out_channels=(8, 16, 16), in_channels=3, out_channels=3, latent_channels=latent_channels,
                         down_block_types=("DownEncoderBlock2D",) * 3, layers_per_block=1,
                         up_block_types=("UpDecoderBlock2D",) * 3, norm_num_groups=8,
                         sample_size=32, **kw)


def build_sd15(out: Path, prediction_type: str = "epsilon", seed: int = 0) -> Path:
    """A tiny StableDiffusionPipeline folder (latents are 1/4 of the image: the VAE has three blocks)."""
    import torch
    from diffusers import DDIMScheduler, StableDiffusionPipeline, UNet2DConditionModel

    tok = clip_tokenizer(out / "tokenizer")
    torch.manual_seed(seed)
    unet = UNet2DConditionModel(block_out_channels=(32, 64), layers_per_block=1, sample_size=16, in_channels=4,
                                out_channels=4, down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
                                up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"), cross_attention_dim=32,
                                norm_num_groups=8, attention_head_dim=8)
    sched = DDIMScheduler(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear", clip_sample=False,
                          set_alpha_to_one=False, prediction_type=prediction_type, steps_offset=1)
    pipe = StableDiffusionPipeline(unet=unet, vae=tiny_vae(seed), text_encoder=clip_text_model(len(tok), False, seed=seed),
                                   tokenizer=tok, scheduler=sched, safety_checker=None, feature_extractor=None,
                                   requires_safety_checker=False)
    pipe.save_pretrained(out)
    return out


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
