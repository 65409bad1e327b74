"""The hand-set Wan VAE codec: a latent is the mean colour of an 8 x 8 block over the frames it
stands for (the first frame alone, then four at a time), and decoding gives those means back."""

from __future__ import annotations

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
