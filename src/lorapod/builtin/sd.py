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


# -- the demo's toy model: a pipeline that draws flat colour before any LoRA is trained
#
# A random VAE decodes even perfect latents to noise, and a random denoiser turns any latents into
# noise, so samples from ``build_sd15`` look the same at every checkpoint. The toy below keeps the
# same diffusers classes (so export, ComfyUI files and eval run unchanged) with two changes: the VAE
# is an exact codec set by hand (the latent is the mean colour of each 8 x 8 pixel block), and the
# denoiser is pretrained from scratch on flat colours, so the base already draws flat colour and a
# LoRA then visibly moves its samples toward what it is trained on.

TOY_COLOURS = {"red": (220, 30, 30), "blue": (30, 60, 220), "green": (30, 180, 60), "yellow": (230, 210, 40),
               "white": (240, 240, 240), "black": (20, 20, 20), "grey": (128, 128, 128), "orange": (240, 140, 20)}
_CARRIER = 100.0


def codec_vae(blocks: int = 4, channels: int = 16):
    """An ``AutoencoderKL`` whose weights are set by hand so that it is an exact codec: the encoder
    averages each 2**(blocks-1) square of pixels into latent channels 0-2 (RGB in [-1, 1]; channel 3
    is 0), the decoder repeats each latent back over its square.

    How the diffusers blocks are made to pass their input through: every resnet's ``conv2`` and
    every attention's ``to_out`` are zero (each adds nothing to its residual), downsamplers average
    a 2 x 2 square, upsamplers are nearest-neighbour with an identity conv. The last GroupNorm
    before each ``conv_out`` would normalise a flat image to nothing, so each group of four channels
    holds ``[x, -x, C, -C]`` with a large constant C: its mean is 0 and its variance C**2 / 2 (to
    a part in 1e5), and the norm's weight C / sqrt(2) undoes it. The SiLU after it is undone by
    ``SiLU(a) - SiLU(-a) == a`` on the pair."""
    import math

    import torch
    from diffusers import AutoencoderKL

    vae = AutoencoderKL(block_out_channels=(channels,) * blocks, in_channels=3, out_channels=3, latent_channels=4,
                        down_block_types=("DownEncoderBlock2D",) * blocks, up_block_types=("UpDecoderBlock2D",) * blocks,
                        layers_per_block=1, norm_num_groups=channels // 4, sample_size=64, scaling_factor=1.0)
    with torch.no_grad():
        for p in vae.parameters():
            p.zero_()
        for m in vae.modules():
            if isinstance(m, torch.nn.GroupNorm):
                m.weight.fill_(1.0)

        def spread(conv: torch.nn.Conv2d, n: int) -> None:  # input channel k -> group k: [x, -x, C, -C]
            for k in range(channels // 4):
                if k < n:
                    conv.weight[4 * k, k, 1, 1] = 1.0
                    conv.weight[4 * k + 1, k, 1, 1] = -1.0
                conv.bias[4 * k + 2] = _CARRIER
                conv.bias[4 * k + 3] = -_CARRIER

        def gather(conv: torch.nn.Conv2d, n: int) -> None:  # group k -> output channel k
            for k in range(n):
                conv.weight[k, 4 * k, 1, 1] = 1.0
                conv.weight[k, 4 * k + 1, 1, 1] = -1.0

        enc, dec = vae.encoder, vae.decoder
        spread(enc.conv_in, 3)
        spread(dec.conv_in, 4)
        for blk in enc.down_blocks:
            for ds in blk.downsamplers or []:  # pads right/bottom, 3 x 3 stride 2: taps [0:2, 0:2] = a 2 x 2 mean
                for c in range(channels):
                    ds.conv.weight[c, c, :2, :2] = 0.25
        for blk in dec.up_blocks:
            for us in blk.upsamplers or []:
                for c in range(channels):
                    us.conv.weight[c, c, 1, 1] = 1.0
        for norm in (enc.conv_norm_out, dec.conv_norm_out):
            norm.weight.fill_(_CARRIER / math.sqrt(2))
        gather(enc.conv_out, 3)
        gather(dec.conv_out, 3)
        enc.conv_out.bias[4:] = -20.0  # log-variance: a posterior with no spread
        for q in (vae.quant_conv, vae.post_quant_conv):
            for c in range(q.weight.shape[0]):
                q.weight[c, c, 0, 0] = 1.0
    return vae


def toy_latents(n: int, side: int, gen):
    """Pretraining data drawn at latent resolution (the codec's latent is the block-mean colour, so
    this is what encoding the pictures would give): flat colours captioned with their name."""
    import torch

    names = list(TOY_COLOURS)
    rgb = torch.tensor([TOY_COLOURS[k] for k in names], dtype=torch.float32) / 127.5 - 1
    x = torch.zeros(n, 4, side, side)
    caps = []
    for i in range(n):
        # the draws are those the shipped weights were trained with (a permutation, then one
        # number that once chose a shape): keep them, or save_toy_weights() writes another file
        pick = int(torch.randperm(len(names), generator=gen)[0])
        torch.rand(1, generator=gen)
        x[i, :3] = rgb[pick][:, None, None]
        caps.append(names[pick])
    return x, caps


# The denoiser's pretraining takes about three minutes on one CPU thread (1500 steps: fewer leave
# its flat colours speckled), too long for a demo that should take well under a minute, so its
# result ships beside this module: ``save_toy_weights()`` writes that file again from this code.
TOY_WEIGHTS = Path(__file__).with_name("data") / "toy-sd15.safetensors"
TOY_PRETRAIN = {"steps": 1500, "batch": 16, "lr": 5e-3, "seed": 0}


def _toy_unet(seed: int):
    import torch
    from diffusers import UNet2DConditionModel

    torch.manual_seed(seed)
    return UNet2DConditionModel(block_out_channels=(16, 32), layers_per_block=1, sample_size=8, in_channels=4,
                                out_channels=4, down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
                                up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"), cross_attention_dim=32,
                                norm_num_groups=8, attention_head_dim=8)


def pretrain_toy(unet, te, tok, sched, steps: int, batch: int, lr: float, seed: int) -> None:
    """Train ``unet`` from scratch on ``toy_latents`` (flat colours captioned with their name) with
    v-prediction, whose half-trained samples are smooth where epsilon's are speckled. The text
    encoder stays as it was built. Deterministic for a seed on one thread."""
    import torch
    import torch.nn.functional as F
    from diffusers import DDPMScheduler

    noiser = DDPMScheduler.from_config(sched.config)
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(unet.parameters(), lr=lr, weight_decay=0.0)
    lr_at = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=max(1, steps), pct_start=0.1)
    embeds: dict[str, torch.Tensor] = {}
    unet.train()
    for _ in range(steps):
        x0, caps = toy_latents(batch, 8, gen)
        with torch.no_grad():
            for c in set(caps) - set(embeds):
                ids = tok([c], padding="max_length", max_length=tok.model_max_length, truncation=True,
                          return_tensors="pt").input_ids
                embeds[c] = te(ids)[0][0]
        cond = torch.stack([embeds[c] for c in caps])
        noise = torch.randn(x0.shape, generator=gen)
        t = torch.randint(0, noiser.config.num_train_timesteps, (batch,), generator=gen)
        pred = unet(noiser.add_noise(x0, noise, t), t, encoder_hidden_states=cond).sample
        loss = F.mse_loss(pred, noiser.get_velocity(x0, noise, t))
        opt.zero_grad()
        loss.backward()
        opt.step()
        lr_at.step()
    unet.eval()


def build_toy_sd15(out: Path, weights: Path | None = TOY_WEIGHTS, **pretrain) -> Path:
    """The demo's base model as a StableDiffusionPipeline folder: ``codec_vae``, the byte-level
    tokenizer, a random CLIP text encoder and a small UNet (latents 8 x 8 at 64 px), with the text
    encoder and UNet from ``weights``, or, with ``weights=None``, the UNet pretrained here
    (``TOY_PRETRAIN``, overridable by keyword: minutes on a CPU)."""
    import torch
    from diffusers import DDIMScheduler, StableDiffusionPipeline
    from safetensors.torch import load_file

    cfg = {**TOY_PRETRAIN, **pretrain}
    tok = clip_tokenizer(out / "tokenizer")
    te = clip_text_model(len(tok), False, seed=cfg["seed"]).eval()
    unet = _toy_unet(cfg["seed"])
    sched = DDIMScheduler(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear", clip_sample=False,
                          set_alpha_to_one=False, prediction_type="v_prediction", steps_offset=1)
    if weights is None:
        pretrain_toy(unet, te, tok, sched, cfg["steps"], cfg["batch"], cfg["lr"], cfg["seed"])
    else:
        state = load_file(str(weights))
        for prefix, module in (("unet.", unet), ("text_encoder.", te)):
            module.load_state_dict({k[len(prefix):]: v.float() for k, v in state.items() if k.startswith(prefix)},
                                   strict=True)
    with torch.no_grad():
        unet.eval()
    pipe = StableDiffusionPipeline(unet=unet, vae=codec_vae(), text_encoder=te, tokenizer=tok, scheduler=sched,
                                   safety_checker=None, feature_extractor=None, requires_safety_checker=False)
    pipe.save_pretrained(out)
    return out


def save_toy_weights(path: Path = TOY_WEIGHTS, **pretrain) -> Path:
    """Pretrain the toy UNet (``TOY_PRETRAIN``) and write it and its text encoder, in fp16, to ``path``:
    ``python -c "from lorapod.builtin.sd import save_toy_weights; save_toy_weights()"``."""
    import tempfile

    import torch
    from diffusers import StableDiffusionPipeline
    from safetensors.torch import save_file

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        pipe = StableDiffusionPipeline.from_pretrained(str(build_toy_sd15(Path(tmp), weights=None, **pretrain)))
    state = {f"unet.{k}": v.half().contiguous() for k, v in pipe.unet.state_dict().items()}
    state.update({f"text_encoder.{k}": v.half().contiguous() for k, v in pipe.text_encoder.state_dict().items()})
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(state, str(path), metadata={"lorapod": json.dumps({"builder": "lorapod.builtin.sd.save_toy_weights",
                                                                 **TOY_PRETRAIN, **pretrain})})
    return path
