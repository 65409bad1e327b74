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


# -- a Wan VAE that is an exact codec
#
# A random ``AutoencoderKLWan`` decodes even perfect latents to noise, so a video demo built on it
# cannot show anything learned. ``codec_wan_vae`` is the first half of a toy Wan that can (the
# image demo's ``lorapod.builtin.sd.codec_vae`` is the same idea for ``AutoencoderKL``): a VAE of
# the real diffusers class, hand-set so that a latent is the mean colour of an 8 x 8 pixel block
# over the frames it stands for. The other half, a transformer that draws a coherent clip from
# it, is not built yet (docs/video.md says what was tried).

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

