"""The tiny Wan2.1 / Wan2.2 pipelines the tests build in code (random ``WanTransformer3DModel``,
``AutoencoderKLWan`` and umT5 encoder, the byte-level tokenizer of ``builtin.sd``) and the video
demo's toy Wan (a hand-set codec VAE and a pretrained transformer), saved as local diffusers
folders: nothing is downloaded."""

from __future__ import annotations

import json
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


# -- a Wan VAE that is an exact codec
#
# A random ``AutoencoderKLWan`` decodes even perfect latents to noise, so a video demo built on it
# cannot show anything learned. ``codec_wan_vae`` is the first half of a toy Wan that can (the
# image demo's ``lorapod.builtin.sd.codec_vae`` is the same idea for ``AutoencoderKL``): a VAE of
# the real diffusers class, hand-set so that a latent is the mean colour of an 8 x 8 pixel block
# over the frames it stands for. The other half, a transformer that draws coherent clips in it,
# is ``build_toy_wan`` below.

_CARRIER = 100.0


def codec_wan_vae(dim: int = 8):
    """An ``AutoencoderKLWan`` (Wan2.1 layout: 8x spatial, 4x causal temporal) whose weights are set
    by hand so that it is an exact codec: latent channels 0-2 are the RGB mean (in [-1, 1]) of each
    8 x 8 block of the first frame, then of each 8 x 8 x 4 block of the frames after it (channel 3
    is 0); the decoder repeats each latent back over its block (the first frame once, then four).

    How the blocks are made to pass their input through (diffusers' autoencoder_kl_wan.py): every
    residual block's ``conv2`` and the attention's ``proj`` are zero, so each adds nothing to its
    residual; causal 3-D convs use only their centre spatial tap on the current frame (index 2 of
    the causally padded kernel); spatial downsamplers (zero pad right/bottom, 3 x 3 stride 2) use
    taps [0:2, 0:2] = a 2 x 2 mean; the temporal downsamplers' ``time_conv`` (3 taps, stride 2, over
    the cached last frame and the chunk) uses taps [0, 1/2, 1/2], so two steps average each chunk
    of four frames; the upsamplers' ``time_conv`` writes its input to both output frames, their
    nearest-exact upsample is followed by an identity conv onto half the channels, and the
    shortcut convs that bring the channels back are identities. The ``WanRMS_norm`` before each
    ``conv_out`` divides by the norm over the channels, so the stream there is ``[x0, -x0, x1, -x1,
    x2, -x2, C, -C]`` with a large carrier C: the norm is C * sqrt(2) to a part in 1e4 and the
    norm's gamma undoes it; the SiLU after it is undone by ``SiLU(a) - SiLU(-a) == a``."""
    import math

    import torch
    from diffusers import AutoencoderKLWan
    from diffusers.models.autoencoders.autoencoder_kl_wan import WanResample

    vae = AutoencoderKLWan(base_dim=dim, z_dim=4, dim_mult=[1, 1, 1, 1], num_res_blocks=1,
                           temperal_downsample=[False, True, True], latents_mean=[0.0] * 4, latents_std=[1.0] * 4)
    with torch.no_grad():
        for p in vae.parameters():
            p.zero_()
        for m in vae.modules():
            if hasattr(m, "gamma"):
                m.gamma.fill_(1.0)
        enc, dec = vae.encoder, vae.decoder

        def pairs(conv, src: int = 3) -> None:  # channel k -> [x_k, -x_k] at 2k, 2k+1, plus the carrier
            centre = tuple(s // 2 for s in conv.weight.shape[3:])
            t = conv.weight.shape[2] - 1  # the current frame's tap
            for k in range(src):
                conv.weight[(2 * k, k, t, *centre)] = 1.0
                conv.weight[(2 * k + 1, k, t, *centre)] = -1.0
            conv.bias[2 * src] = _CARRIER
            conv.bias[2 * src + 1] = -_CARRIER

        def unpair(conv) -> None:  # [x_k, -x_k] -> SiLU'd pairs -> x_k
            for k in range(3):
                conv.weight[k, 2 * k, 2, 1, 1] = 1.0
                conv.weight[k, 2 * k + 1, 2, 1, 1] = -1.0

        pairs(enc.conv_in)
        for m in enc.down_blocks:
            if isinstance(m, WanResample):
                for c in range(dim):
                    m.resample[1].weight[c, c, :2, :2] = 0.25
                if m.mode == "downsample3d":
                    for c in range(dim):
                        m.time_conv.weight[c, c, 1:, 0, 0] = 0.5
        gamma = _CARRIER * math.sqrt(2) / math.sqrt(dim)  # undoes F.normalize(x) * sqrt(dim)
        enc.norm_out.gamma.fill_(gamma)
        unpair(enc.conv_out)
        enc.conv_out.bias[4:] = -20.0  # log-variance: a posterior with no spread
        for q in (vae.quant_conv, vae.post_quant_conv):
            for c in range(q.weight.shape[0]):
                q.weight[c, c, 0, 0, 0] = 1.0
        for k in range(3):
            dec.conv_in.weight[k, k, 2, 1, 1] = 1.0
        for blk in dec.up_blocks:
            for us in blk.upsamplers or []:
                for c in range(dim // 2):
                    us.resample[1].weight[c, c, 1, 1] = 1.0
                if us.mode == "upsample3d":
                    for c in range(dim):
                        us.time_conv.weight[c, c, 2, 0, 0] = 1.0
                        us.time_conv.weight[dim + c, c, 2, 0, 0] = 1.0
        for blk in dec.up_blocks[1:-1]:
            for c in range(dim // 2):
                blk.resnets[0].conv_shortcut.weight[c, c, 0, 0, 0] = 1.0
        pairs(dec.up_blocks[-1].resnets[0].conv_shortcut)
        dec.norm_out.gamma.fill_(gamma)
        unpair(dec.conv_out)
    return vae



# -- the video demo's toy model: a Wan that draws flat colours and squares before any LoRA
#
# The second half beside ``codec_wan_vae``: a small ``WanTransformer3DModel`` pretrained from
# scratch at latent resolution on 64 x 64 px clips (4 x 4 tokens of 16 px, one to three latent
# frames) of flat colours and of a still square, each captioned with its colours. Wan's positions
# are rotary (relative), so the model has no idea where a frame or a token is; what it has to
# learn is how tokens relate. It learns that quickly only when a square is exactly one token, so
# the toy's world is made of those, and keeping a square in place from frame to frame it did not
# learn at all until its first block was given heads that look along time (``_pool_over_time``).

TOY_WAN_WEIGHTS = Path(__file__).with_name("data") / "toy-wan21.safetensors"
TOY_WAN_PRETRAIN = {"steps": 6000, "batch": 16, "lr": 2e-3, "seed": 0}
TOY_WAN_KINDS = ("flat", "still")
TOY_WAN_SIDE = 8  # latents per side: 64 px


def _toy_wan_transformer(seed: int):
    import torch
    from diffusers import WanTransformer3DModel

    torch.manual_seed(seed)
    tr = WanTransformer3DModel(patch_size=(1, 2, 2), num_attention_heads=4, attention_head_dim=16, in_channels=4,
                               out_channels=4, text_dim=32, freq_dim=32, ffn_dim=128, num_layers=3, rope_max_seq_len=32)
    _pool_over_time(tr.blocks[0].attn1)
    return tr


POOL_SHARPNESS = 3.0
POOL_BIAS = 10.0


def _pool_over_time(attn) -> None:
    """Set the first block's self-attention queries and keys by hand (its values and output stay
    learned): heads 0 and 1 look only at the tokens in the same place in every latent frame, heads 2
    and 3 at every token alike. Pretraining alone did not teach a model this small to keep a square
    in one place from frame to frame; with this it only has to learn what to do with the pooled
    evidence.

    How: ``to_q`` and ``to_k`` have zero weights, so a query or key is its bias, the same for every
    token, and the score between two tokens depends only on their rotary positions. Wan's head of 16
    splits into rotary pairs for time (dims 0-7), height (8-11) and width (12-15), the first pair
    of each turning one radian per token (diffusers' ``WanRotaryPosEmbed``). Heads 0-1 put 1 in the
    first height and width pair and nothing in the time pairs, so their score is
    ``c * (cos(dh) + cos(dw))``: highest at the same place, whatever the frame; the RMS norm over the
    64 dims makes those entries 4 whatever the bias, its weight (``POOL_SHARPNESS``) 12, so ``c`` is
    36 and a token one place away gets e**-16 of the weight. Heads 2-3 are zero: a flat score, the
    mean of all tokens. The bias is large (``POOL_BIAS``) so that a LoRA on these projections, which
    adds to it, bends the pattern only as far as it learns to, not at its first steps."""
    import torch

    with torch.no_grad():
        for lin, norm in ((attn.to_q, attn.norm_q), (attn.to_k, attn.norm_k)):
            lin.weight.zero_()
            lin.bias.zero_()
            for head in (0, 1):
                lin.bias[16 * head + 8] = POOL_BIAS  # height, 1 rad per token
                lin.bias[16 * head + 12] = POOL_BIAS  # width, 1 rad per token
            norm.weight.fill_(POOL_SHARPNESS)
            for p in (*lin.parameters(), *norm.parameters()):
                p.requires_grad_(False)


def _toy_text_encoder(vocab: int, seed: int):
    import torch
    from transformers import UMT5Config, UMT5EncoderModel

    torch.manual_seed(seed)
    return UMT5EncoderModel(UMT5Config(vocab_size=vocab, d_model=32, d_kv=8, d_ff=37, num_layers=2, num_heads=4,
                                       relative_attention_num_buckets=8, pad_token_id=vocab - 1)).eval()


def toy_wan_clip(kind: str, frames: int, gen):
    """One pretraining clip at latent resolution, (4, frames, 6, 6), and its caption: the codec's
    latent is the block-mean colour, so this is what encoding such a clip would give. ``kind`` is
    ``flat`` or ``still``: a square of 2 x 2 latents (16 px, one token) on the token grid, in the
    same place in every frame."""
    import torch

    from lorapod.builtin.sd import TOY_COLOURS

    names = list(TOY_COLOURS)
    rgb = torch.tensor([TOY_COLOURS[k] for k in names], dtype=torch.float32) / 127.5 - 1
    pick = torch.randperm(len(names), generator=gen)
    bg, fg = int(pick[0]), int(pick[1])
    n = TOY_WAN_SIDE
    x = torch.zeros(4, frames, n, n)
    x[:3] = rgb[bg][:, None, None, None]
    if kind == "flat":
        return x, names[bg]
    col = 2 * int(torch.randint(n // 2, (1,), generator=gen))
    row = 2 * int(torch.randint(n // 2, (1,), generator=gen))
    x[:3, :, row:row + 2, col:col + 2] = rgb[fg][:, None, None, None]
    return x, f"a {names[fg]} square on {names[bg]}"


def toy_wan_text(tok, te, captions: list[str], length: int = 512):
    """umT5 states as ``WanPipeline`` (and lorapod's engine) make them: the real tokens' states,
    then zeros up to ``length`` (512, Wan's text length)."""
    import torch
    from diffusers.pipelines.wan.pipeline_wan import prompt_clean

    enc = tok([prompt_clean(c) for c in captions], padding="max_length", max_length=length, truncation=True,
              add_special_tokens=True, return_attention_mask=True, return_tensors="pt")
    with torch.no_grad():
        states = te(enc.input_ids, enc.attention_mask).last_hidden_state
    return states * enc.attention_mask.unsqueeze(-1).to(states.dtype)


def pretrain_toy_wan(tr, tok, te, steps: int, batch: int, lr: float, seed: int, log=None) -> None:
    """Train ``tr`` from scratch on ``toy_wan_clip`` with the engine's objective (flow matching,
    shift-3 noise levels, target ``noise - x``), one to three latent frames per batch and one
    caption in ten dropped (so it also draws without a prompt). Deterministic for a seed on one thread."""
    import torch
    import torch.nn.functional as F

    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW([p for p in tr.parameters() if p.requires_grad], lr=lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=max(1, steps), pct_start=0.05)
    cache: dict[str, torch.Tensor] = {}

    def text(c: str) -> torch.Tensor:
        if c not in cache:
            cache[c] = toy_wan_text(tok, te, [c])[0]
        return cache[c]

    tr.train()
    for step in range(steps):
        frames = (1, 2, 3, 3)[int(torch.randint(4, (1,), generator=gen))]
        clips = [toy_wan_clip(TOY_WAN_KINDS[int(torch.randint(len(TOY_WAN_KINDS), (1,), generator=gen))], frames, gen)
                 for _ in range(batch)]
        x0 = torch.stack([x for x, _ in clips])
        cond = torch.stack([text(c if float(torch.rand(1, generator=gen)) > 0.1 else "") for _, c in clips])
        noise = torch.randn(x0.shape, generator=gen)
        u = torch.rand(batch, generator=gen)
        sigma = (3.0 * u / (1 + 2.0 * u)).view(-1, 1, 1, 1, 1)  # the engine's timestep_shift 3
        pred = tr(hidden_states=(1 - sigma) * x0 + sigma * noise, timestep=sigma.flatten() * 1000,
                  encoder_hidden_states=cond, return_dict=False)[0]
        loss = F.mse_loss(pred, noise - x0)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(tr.parameters(), 1.0)
        opt.step()
        sched.step()
        if log is not None and (step % 500 == 0 or step == steps - 1):
            log(f"pretraining step {step + 1}/{steps}: loss {loss.item():.4f}")
    tr.eval()


def build_toy_wan(out: Path, weights: Path | None = TOY_WAN_WEIGHTS, log=None, **pretrain) -> Path:
    """The video demo's base model as a WanPipeline folder: ``codec_wan_vae``, the byte-level
    tokenizer, a small umT5 and the toy transformer, the last two from ``weights`` or, with
    ``weights=None``, pretrained here (``TOY_WAN_PRETRAIN``, overridable by keyword: minutes)."""
    import torch
    from diffusers import UniPCMultistepScheduler, WanPipeline
    from safetensors.torch import load_file

    cfg = {**TOY_WAN_PRETRAIN, **pretrain}
    tok = clip_tokenizer(out / "tokenizer")
    te = _toy_text_encoder(len(tok), cfg["seed"])
    tr = _toy_wan_transformer(cfg["seed"])
    if weights is None:
        pretrain_toy_wan(tr, tok, te, cfg["steps"], cfg["batch"], cfg["lr"], cfg["seed"], log=log)
    else:
        state = load_file(str(weights))
        for prefix, module in (("transformer.", tr), ("text_encoder.", te)):
            module.load_state_dict({k[len(prefix):]: v.float() for k, v in state.items() if k.startswith(prefix)},
                                   strict=True)
    sched = UniPCMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True, num_train_timesteps=1000,
                                    flow_shift=3.0)
    with torch.no_grad():
        tr.eval()
    WanPipeline(tokenizer=tok, text_encoder=te, vae=codec_wan_vae(), scheduler=sched, transformer=tr).save_pretrained(out)
    return out


def toy_wan_recipe(**pretrain) -> dict:
    """What a weights file was pretrained with (stored in its metadata): a test compares the shipped
    file's with this code's, so changing the recipe without writing the file again fails."""
    return {"builder": "lorapod.builtin.wan.save_toy_wan_weights", **TOY_WAN_PRETRAIN, **pretrain,
            "kinds": list(TOY_WAN_KINDS), "side": TOY_WAN_SIDE}


def save_toy_wan_weights(path: Path = TOY_WAN_WEIGHTS, log=print, **pretrain) -> Path:
    """Pretrain the toy transformer (``TOY_WAN_PRETRAIN``) and write it and its text encoder, in
    fp16, to ``path``: ``python -c "from lorapod.builtin.wan import save_toy_wan_weights as s; s()"``."""
    import tempfile

    import torch
    from diffusers import WanPipeline
    from safetensors.torch import save_file

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        pipe = WanPipeline.from_pretrained(str(build_toy_wan(Path(tmp), weights=None, log=log, **pretrain)))
    state = {f"transformer.{k}": v.half().contiguous() for k, v in pipe.transformer.state_dict().items()}
    state.update({f"text_encoder.{k}": v.half().contiguous() for k, v in pipe.text_encoder.state_dict().items()})
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(state, str(path), metadata={"lorapod": json.dumps(toy_wan_recipe(**pretrain))})
    return path
