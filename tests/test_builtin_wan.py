"""The hand-set Wan VAE codec: a latent is the mean colour of an 8 x 8 block over the frames it
stands for (the first frame alone, then four at a time), and decoding gives those means back."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from lorapod.builtin.wan import codec_wan_vae

torch.set_num_threads(1)


def _block_means(x: torch.Tensor) -> torch.Tensor:
    """(B, 3, 1 + 4n, H, W) -> (B, 3, 1 + n, H/8, W/8): Wan's causal chunks, then 8 x 8 means."""
    b, c, f, h, w = x.shape
    rest = x[:, :, 1:].reshape(b, c, (f - 1) // 4, 4, h, w).mean(3)
    return F.avg_pool3d(torch.cat([x[:, :, :1], rest], 2), (1, 8, 8))


def test_the_codec_wan_vae_encodes_block_means_over_space_and_time_and_decodes_them_back(tmp_path):
    from diffusers import AutoencoderKLWan

    codec_wan_vae().save_pretrained(tmp_path / "vae")  # as a pipeline folder holds it
    vae = AutoencoderKLWan.from_pretrained(str(tmp_path / "vae")).eval()
    g = torch.Generator().manual_seed(0)
    x = torch.rand(2, 3, 9, 48, 64, generator=g) * 2 - 1  # any pixels, 9 frames: 3 latent frames
    with torch.no_grad():
        z = vae.encode(x).latent_dist.mode()
        back = vae.decode(z).sample
    means = _block_means(x)
    assert z.shape == (2, 4, 3, 6, 8)
    assert torch.allclose(z[:, :3], means, atol=1e-4) and z[:, 3].abs().max() < 1e-6
    want = means.repeat_interleave(8, 3).repeat_interleave(8, 4)
    want = torch.cat([want[:, :, :1], want[:, :, 1:].repeat_interleave(4, 2)], 2)  # frame 0, then 4 per latent
    assert back.shape == x.shape and torch.allclose(back, want, atol=1e-4)
    # a clip already made of such blocks comes back exactly
    with torch.no_grad():
        again = vae.decode(vae.encode(want).latent_dist.mode()).sample
    assert torch.allclose(again, want, atol=1e-4)


def test_toy_wan_clips_put_a_one_token_square_on_the_token_grid_in_the_same_place_every_frame():
    from lorapod.builtin.wan import toy_wan_clip

    g = torch.Generator().manual_seed(0)
    for _ in range(20):
        x, caption = toy_wan_clip("still", 3, g)
        assert x.shape == (4, 3, 8, 8) and x[3].abs().max() == 0
        colours, counts = x[:3, 0].reshape(3, -1).T.unique(dim=0, return_counts=True)
        odd = (x[:3, 0] != colours[counts.argmax()][:, None, None]).any(0)  # latents not the background colour
        ys, xs = torch.nonzero(odd, as_tuple=True)
        assert len(ys) == 4 and ys.min() % 2 == 0 and xs.min() % 2 == 0  # 2 x 2 latents = one token, on the grid
        assert torch.equal(x[:, 0], x[:, 2]) and caption.startswith("a ") and " square on " in caption
    flat, name = toy_wan_clip("flat", 1, g)
    assert (flat[:3] == flat[:3, :, :1, :1]).all() and " " not in name


def test_toy_wan_pretraining_is_deterministic_and_learns(tmp_path):
    from lorapod.builtin.sd import clip_tokenizer
    from lorapod.builtin.wan import _toy_text_encoder, _toy_wan_transformer, pretrain_toy_wan

    tok = clip_tokenizer(tmp_path / "tok")
    te = _toy_text_encoder(len(tok), 0)
    runs, losses = [], []
    for _ in range(2):
        tr = _toy_wan_transformer(0)
        seen: list[str] = []
        pretrain_toy_wan(tr, tok, te, steps=30, batch=4, lr=2e-3, seed=0, log=seen.append)
        runs.append(tr.state_dict())
        losses.append([float(m.rsplit(" ", 1)[1]) for m in seen])
    assert all(torch.equal(runs[0][k], runs[1][k]) for k in runs[0])
    assert losses[0] == losses[1] and losses[0][-1] < losses[0][0] / 2
    fresh = _toy_wan_transformer(0).state_dict()  # the hand-set queries and keys are not trained
    hand_set = [k for k in fresh if k.startswith("blocks.0.attn1.") and k.split(".")[3] in ("to_q", "to_k", "norm_q", "norm_k")]
    assert len(hand_set) == 6 and all(torch.equal(fresh[k], runs[0][k]) for k in hand_set)
    assert not torch.equal(fresh["blocks.0.attn1.to_v.weight"], runs[0]["blocks.0.attn1.to_v.weight"])


def test_the_toy_wans_first_block_pools_each_place_over_time_and_the_whole_clip():
    """What ``_pool_over_time`` sets, read through diffusers' own attention: run block 0's
    self-attention on tokens that differ only in their values, and see whose values each head mixes."""
    from lorapod.builtin.wan import _toy_wan_transformer

    tr = _toy_wan_transformer(0).eval()
    attn = tr.blocks[0].attn1
    with torch.no_grad():
        attn.to_v.weight.copy_(torch.eye(64))
        attn.to_v.bias.zero_()
        attn.to_out[0].weight.copy_(torch.eye(64))
        attn.to_out[0].bias.zero_()
        rotary = tr.rope(torch.zeros(1, 4, 3, 8, 8))  # 3 latent frames of 4 x 4 tokens
        values = torch.randn(1, 48, 64, generator=torch.Generator().manual_seed(0))
        out = attn(values, rotary_emb=rotary)
    place = values.reshape(3, 16, 64).mean(0)  # each place's mean over the frames
    assert torch.allclose(out[0, :, :32], place.repeat(3, 1)[:, :32], atol=1e-4)  # heads 0-1
    assert torch.allclose(out[0, :, 32:], values[0].mean(0, keepdim=True)[:, 32:].expand(48, -1), atol=1e-4)  # 2-3


def test_the_shipped_toy_wan_is_what_this_code_pretrains_and_draws_still_flat_colour_and_squares(tmp_path):
    """The weights beside the code were written by ``save_toy_wan_weights`` with today's recipe, and
    the base they make draws what it was taught: a flat colour, and a square that stays put."""
    import json

    from diffusers import WanPipeline
    from safetensors import safe_open

    from lorapod.builtin.wan import TOY_WAN_WEIGHTS, build_toy_wan, toy_wan_recipe

    with safe_open(str(TOY_WAN_WEIGHTS), "pt") as fh:
        assert json.loads(fh.metadata()["lorapod"]) == toy_wan_recipe()
    pipe = WanPipeline.from_pretrained(str(build_toy_wan(tmp_path / "toy")))
    pipe.set_progress_bar_config(disable=True)

    def draw(prompt: str, seed: int):
        return pipe(prompt, width=64, height=64, num_frames=9, num_inference_steps=20, guidance_scale=1.0,
                    generator=torch.Generator().manual_seed(seed), output_type="np").frames[0] * 255

    red = draw("red", 0)
    assert abs(red[..., 0].mean() - 220) < 25 and red[..., 1:].mean() < 60 and red.std(axis=(1, 2)).max() < 20
    blue = (30, 60, 220)
    squares = 0
    for seed in range(8):
        clip = draw("a red square on blue", seed)
        is_blue = (np.abs(clip - blue).sum(-1) < 90).mean()
        is_red = (np.abs(clip - (220, 30, 30)).sum(-1) < 90)
        assert is_blue > 0.6, (seed, is_blue)
        assert np.abs(clip[8] - clip[1]).mean() < 8  # it stays where it is from frame to frame
        squares += bool(is_red[1:].mean() > 0.03)
    assert squares >= 2  # 3 of these 8 on the machine that wrote the file: one small thing is the hard part
