"""lorapod's Z-Image and Qwen-Image losses against diffusers' own LoRA training scripts.

The scripts (tests/reference/diffusers/, verbatim from huggingface/diffusers) keep their training
step inside ``main()``; this test cuts out the script's own lines, from the latent normalisation to
``loss = loss.mean()`` (plus its ``get_sigmas`` and, for Qwen-Image, its latent statistics), and
executes them with the names they use, on the tiny pipelines: the script's prompt embeddings (its
``compute_text_embeddings``), its noise (``torch.randn_like`` after a fixed seed) and its timestep
(the one ``compute_density_for_timestep_sampling`` returns, fixed here). lorapod's family then encodes
the same caption and latents and computes its loss at the script's sigma with the same noise; the
two must agree to float32 rounding. So the text, the latent normalisation, the packing, the
timestep convention (sigma for Qwen-Image, 1 - sigma and a negated prediction for Z-Image) and the
target are all held to the reference, not to lorapod's own reading of it.
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from lorapod.engine.diffusion.families import FAMILIES

torch.set_num_threads(1)
SCRIPTS = Path(__file__).parent / "reference" / "diffusers"


def _cut(script: str, first: str, last: str) -> str:
    """The script's lines from the one containing ``first`` to the next containing ``last``, dedented."""
    lines = (SCRIPTS / script).read_text(encoding="utf-8").splitlines()
    i = next(n for n, line in enumerate(lines) if first in line)
    j = next(n for n in range(i, len(lines)) if last in lines[n])
    return textwrap.dedent("\n".join(lines[i : j + 1]))


@pytest.fixture(scope="module")
def pipes(tmp_path_factory):
    import diffusers

    from lorapod.engine.diffusion.families.qwenimage import tiny as qwen_tiny
    from lorapod.engine.diffusion.families.zimage import tiny as zimage_tiny

    root = tmp_path_factory.mktemp("ref")
    out = {}
    for name, build in (("zimage", zimage_tiny.build), ("qwenimage", qwen_tiny.build)):
        folder = build(root / name)
        out[name] = getattr(diffusers, FAMILIES[name].pipeline_class).from_pretrained(str(folder))
    return out


def _namespace(pipe, index: int, **more) -> dict:
    import copy

    from diffusers import FlowMatchEulerDiscreteScheduler, QwenImagePipeline
    from diffusers.training_utils import compute_loss_weighting_for_sd3

    sched = copy.deepcopy(FlowMatchEulerDiscreteScheduler.from_config(pipe.scheduler.config, shift=3.0))
    u = torch.tensor([index / sched.config.num_train_timesteps])
    return {
        "torch": torch, "copy": copy, "QwenImagePipeline": QwenImagePipeline,
        "accelerator": SimpleNamespace(device=torch.device("cpu")),
        "args": SimpleNamespace(weighting_scheme="none", logit_mean=0.0, logit_std=1.0, mode_scale=1.29,
                                with_prior_preservation=False, max_sequence_length=512, prior_loss_weight=1.0),
        "noise_scheduler_copy": sched, "transformer": pipe.transformer, "vae": pipe.vae,
        "weight_dtype": torch.float32, "vae_scale_factor": 8,
        "compute_density_for_timestep_sampling": lambda **kw: u,
        "compute_loss_weighting_for_sd3": compute_loss_weighting_for_sd3,
        **more,
    }


def _lorapod_loss(family, comps, x0: torch.Tensor, noise: torch.Tensor, sigma: torch.Tensor, cond) -> torch.Tensor:
    s = sigma.view(-1, 1, 1, 1)
    pred = family.forward(comps, (1 - s) * x0 + s * noise, sigma, cond, {})
    return torch.nn.functional.mse_loss(pred.float(), (noise - x0).float())


@pytest.mark.parametrize("index", [150, 700])
@pytest.mark.parametrize("name", ["zimage", "qwenimage"])
@torch.no_grad()
def test_the_loss_is_the_diffusers_training_scripts(pipes, name, index):
    pipe = pipes[name]
    fam = FAMILIES[name]()
    comps = fam.components(pipe, "ref")
    caption = "zxq, a red square on the table"
    pixels = torch.rand(1, 3, 64, 64, generator=torch.Generator().manual_seed(1)) * 2 - 1
    x0 = fam.encode_latents(comps, pixels)
    cond = fam.encode_text(comps, [caption], torch.device("cpu"))

    if name == "zimage":
        script = "train_dreambooth_lora_z_image.py"
        ns = _namespace(pipe, index, vae_config_shift_factor=pipe.vae.config.shift_factor,
                        vae_config_scaling_factor=pipe.vae.config.scaling_factor,
                        model_input=pipe.vae.encode(pixels).latent_dist.mode())
        exec(_cut(script, "def compute_text_embeddings", "return prompt_embeds"), ns)
        ns["prompt_embeds"] = ns["compute_text_embeddings"](caption, pipe)
        step = _cut(script, "model_input = (model_input - vae_config_shift_factor)", "loss = loss.mean()")
        ref_text = ns["prompt_embeds"][0]
        got_text = cond["prompt_embeds"][0, : int(cond["prompt_mask"][0].sum())]
    else:
        script = "train_dreambooth_lora_qwen_image.py"
        ns = _namespace(pipe, index, model_input=pipe.vae.encode(pixels.unsqueeze(2)).latent_dist.mode())
        exec(_cut(script, "latents_mean = (torch.tensor(vae.config.latents_mean)", "latents_std = 1.0 /"), ns)
        exec(_cut(script, "def compute_text_embeddings", "return prompt_embeds, prompt_embeds_mask"), ns)
        ns["prompt_embeds"], ns["prompt_embeds_mask"] = ns["compute_text_embeddings"](caption, pipe)
        step = _cut(script, "model_input = (model_input - latents_mean) * latents_std", "loss = loss.mean()")
        ref_text = ns["prompt_embeds"][0]
        got_text = cond["prompt_embeds"][0]
    exec(_cut(script, "def get_sigmas(", "return sigma"), ns)
    torch.manual_seed(0)
    exec(step, ns)

    assert torch.allclose(got_text, ref_text, atol=1e-6), "text embeddings differ from the script's"
    ref_x0 = ns["model_input"].reshape(x0.shape)
    assert torch.allclose(x0, ref_x0, atol=1e-6), "latent normalisation differs from the script's"
    sigma = ns["sigmas"].flatten()
    assert 0.05 < float(sigma) < 0.99
    mine = _lorapod_loss(fam, comps, x0, ns["noise"].reshape(x0.shape), sigma, cond)
    assert float(mine) == pytest.approx(float(ns["loss"]), rel=1e-5)
    # and the check can fail: the other timestep convention gives another loss
    assert float(_lorapod_loss(fam, comps, x0, ns["noise"].reshape(x0.shape), 1 - sigma, cond)) != pytest.approx(
        float(ns["loss"]), rel=1e-3)
