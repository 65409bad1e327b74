"""The toy base model the image demo trains on: its VAE is an exact codec, its UNet draws flat colour."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lorapod.builtin.sd import TOY_COLOURS, build_toy_sd15, codec_vae

torch.set_num_threads(1)


def test_the_codec_vae_encodes_block_means_and_decodes_them_back_exactly():
    vae = codec_vae()
    g = torch.Generator().manual_seed(0)
    blocks = torch.rand(2, 3, 6, 8, generator=g) * 2 - 1  # any colours, one per 8 x 8 block
    x = blocks.repeat_interleave(8, 2).repeat_interleave(8, 3)
    with torch.no_grad():
        z = vae.encode(x).latent_dist.mean
        back = vae.decode(z).sample
    assert z.shape == (2, 4, 6, 8)
    assert torch.allclose(z[:, :3], blocks, atol=1e-4) and z[:, 3].abs().max() < 1e-6
    assert torch.allclose(back, x, atol=1e-4)
    # a picture that is not block-constant comes back as its block means
    y = torch.rand(1, 3, 16, 16, generator=g) * 2 - 1
    with torch.no_grad():
        z = vae.encode(y).latent_dist.mean
    assert torch.allclose(z[:, :3], torch.nn.functional.avg_pool2d(y, 8), atol=1e-4)


@pytest.mark.parametrize("name", ["red", "green", "blue"])
def test_the_toy_base_draws_the_flat_colour_it_is_asked_for(tmp_path, name):
    from diffusers import StableDiffusionPipeline

    pipe = StableDiffusionPipeline.from_pretrained(str(build_toy_sd15(tmp_path / "toy")))
    pipe.set_progress_bar_config(disable=True)
    img = np.asarray(pipe(name, num_inference_steps=8, guidance_scale=1.0, width=64, height=64,
                          generator=torch.Generator().manual_seed(1)).images[0], np.float32)
    want = np.array(TOY_COLOURS[name], np.float32)
    assert np.linalg.norm(img.reshape(-1, 3).mean(0) - want) < 40  # that colour ...
    assert img.reshape(-1, 3).std(0).max() < 20  # ... and flat (a random base draws speckled noise)
