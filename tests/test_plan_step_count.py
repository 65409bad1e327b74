"""plan/step_count.py's counters, and the catalog against what they count on the architectures
(plan/counted_models.py, plan/counted_llm.py).

The first tests pin the counters on steps whose memory is known by hand. The last ones rebuild
SD 1.5 and SDXL from their published configs on the meta device and require models.yaml to hold
what the architecture gives: the figures were never fitted to the published measurements, and
this keeps anyone from tuning them by hand.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from lorapod.catalog.models import find_model
from lorapod.plan.counted_models import unet_figures
from lorapod.plan.step_count import count_forward, count_step, count_traffic


class _Weights(torch.nn.Module):
    def __init__(self, *shape: int) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(*shape))


def test_saved_bytes_of_a_matmul_and_relu_are_counted_exactly():
    """x @ W saves x (made before the count: not counted) and relu saves its output; the matmul's
    own output dies once relu has read it. What the forward leaves: relu's output and the loss."""
    m, k, n = 64, 32, 48
    mod, x = _Weights(k, n), torch.zeros(m, k)
    step = count_step(mod, lambda: (x @ mod.w).relu().sum())
    assert step.saved_after_forward == m * n * 4 + 4
    assert 2 * m * n * 4 <= step.peak < 2 * m * n * 4 + k * n * 4  # relu's gradient beside its output


def test_attention_keeps_what_a_fused_kernel_keeps_not_the_score_matrix():
    heads, length, dim = 4, 256, 16
    mod = _Weights(1, heads, length, dim)
    step = count_step(mod, lambda: F.scaled_dot_product_attention(mod.w * 2, mod.w * 3, mod.w * 4).sum())
    qkv_out = 4 * heads * length * dim * 4
    lse = heads * length * 4
    assert step.saved_after_forward == qkv_out + lse + 4
    assert step.peak < qkv_out + heads * length * length * 4  # never a (length x length) matrix


def test_forward_count_of_a_linear_layer():
    lin = torch.nn.Linear(128, 64, bias=False)
    x = torch.zeros(32, 128)
    count = count_forward(lambda: lin(x).relu())
    assert count.tflops * 1e12 == 2 * 32 * 128 * 64 and count.attention_tflops == 0
    assert count.kernels == 2  # the matmul and the relu; the weight's transpose is a view


def test_traffic_reads_a_broadcast_input_once_and_an_in_place_op_both_ways():
    rows, cols = 64, 32
    with torch.device("meta"):
        a, b = torch.empty(rows, cols), torch.empty(1, cols)
    moved = count_traffic(lambda: (a + b).mul_(2))
    # add: reads a (rows x cols) and b (one row, broadcast), writes rows x cols; mul_: reads and
    # writes its input. float32 throughout.
    assert moved.bytes == 4 * (rows * cols + cols + rows * cols) + 4 * 2 * rows * cols
    assert moved.kernels == 2


def test_gptq_dequantisation_figures_are_the_counted_ones():
    """GPTQ's speed term moves what AutoGPTQ's eager unpacking moves (plan/counted_llm.py)."""
    from lorapod.plan.counted_llm import gptq_dequant
    from lorapod.plan.work import GPTQ_DEQUANT_BYTES, GPTQ_DEQUANT_KERNELS

    for shape in ((4096, 4096), (5120, 13696)):
        moved = gptq_dequant(4, *shape)
        assert round(moved.bytes / (shape[0] * shape[1]), 2) == GPTQ_DEQUANT_BYTES
        assert moved.kernels == GPTQ_DEQUANT_KERNELS
    # by hand, per weight: the int32 shift writes 4 bytes (reading the packed 0.5), the int8 cast
    # reads 4 and writes 1, the in-place mask 1 + 1, the zero-point subtraction 1 + 1, the fp16
    # scale multiply 1 + 2; the per-group zero points and scales add about 0.13
    assert 16.5 < GPTQ_DEQUANT_BYTES < 16.7


@pytest.mark.parametrize(("shape", "targets"), [
    ((4096, 11008, 32, 8, 128), ()),
    ((2048, 5632, 16, 16, 128), ("q_proj", "v_proj")),
    ((3072, 8192, 24, 8, 64), ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")),
])
def test_llm_memory_bound_traffic_is_the_counted_one(shape, targets):
    """plan/work.py's coefficients give what the Llama layer's non-matmul operators move, for
    widths, grouped key/value heads, head sizes and LoRA targets they were not read from."""
    from dataclasses import replace

    from lorapod.catalog.models import find_model
    from lorapod.plan.counted_llm import llama_layer_traffic
    from lorapod.plan.vram import Settings
    from lorapod.plan.work import layer_traffic

    hidden, inter, heads, kv, head_dim = shape
    arch = replace(find_model("meta-llama/Llama-3.2-1B"), hidden=hidden, intermediate=inter, heads=heads, kv_heads=kv,
                   head_dim=head_dim)
    settings = Settings(base_dtype="bf16", r=8, targets=targets, optimizer="adamw", gradient_checkpointing=False, batch=1)
    fwd, bwd = llama_layer_traffic(hidden, inter, heads, kv, head_dim, targets, tokens=1024)
    # one forward and one backward; the norms' weights (read once a step) spread over the tokens
    assert layer_traffic(arch, settings, 1) == pytest.approx(fwd + bwd, rel=1e-4)
    assert layer_traffic(arch, settings, 2) == pytest.approx(2 * fwd + bwd, rel=1e-4)


@pytest.mark.parametrize("name", ["hf", "transformers-4.46", "qwen-remote-code", "lorapod"])
def test_logit_bytes_of_eager_losses_are_the_counted_ones(name):
    from lorapod.plan.counted_llm import loss_bytes_per_logit
    from lorapod.plan.frameworks import framework

    assert round(loss_bytes_per_logit(name), 1) == framework(name).logit_bytes
    assert round(loss_bytes_per_logit(name, tokens=1024, vocab=8192), 1) == framework(name).logit_bytes


@pytest.mark.parametrize("family", ["sd15", "sdxl"])
def test_catalog_unet_figures_are_the_counted_ones(family):
    m = find_model(family)
    counted = unet_figures(family, m.ref_resolution)
    assert {
        "fwd_tflops_at_ref": m.fwd_tflops_at_ref, "attn_tflops_at_ref": m.attn_tflops_at_ref,
        "kernels_per_fwd": m.kernels_per_fwd, "vae_encode_tflops_at_ref": m.vae_encode_tflops_at_ref,
        "activations_gb_at_ref.checkpointing": m.activations_gc_gb,
        "activations_gb_at_ref.no_checkpointing": m.activations_full_gb,
        "traffic_gb_at_ref.forward": m.traffic_gb_at_ref[0], "traffic_gb_at_ref.backward": m.traffic_gb_at_ref[1],
    } == counted


def test_unet_activations_scale_with_pixels_and_checkpointing_saves_most():
    """Fused attention makes activation memory linear in the pixels, which is how the planner
    scales the reference figure to other resolutions."""
    from lorapod.plan.counted_models import unet_step

    at512 = unet_step("sd15", 512, checkpointing=False).peak
    at768 = unet_step("sd15", 768, checkpointing=False).peak
    assert at768 / at512 == pytest.approx((768 / 512) ** 2, rel=0.02)
    assert unet_step("sd15", 512, checkpointing=True).peak < 0.3 * at512


def test_llm_kernel_counts_are_the_counted_ones():
    from lorapod.plan.counted_llm import LLAMA_LINEARS, llama_layer_kernels
    from lorapod.plan.work import LLM_KERNELS_PER_LAYER, LORA_KERNELS

    bare = llama_layer_kernels()
    assert bare == LLM_KERNELS_PER_LAYER
    assert llama_layer_kernels(("q_proj", "v_proj")) == bare + 2 * LORA_KERNELS
    assert llama_layer_kernels(LLAMA_LINEARS) == bare + len(LLAMA_LINEARS) * LORA_KERNELS


@pytest.mark.parametrize("key", ["flux1", "flux2-klein-4b", "flux2-klein-9b", "wan21-1.3b", "wan21-14b", "wan22-ti2v-5b"])
def test_catalog_dit_figures_are_the_counted_ones(key):
    from lorapod.plan.counted_models import dit_figures

    counted = dit_figures(key)
    names = {"flux1": ["flux1-dev", "flux1-schnell"], "wan21-14b": ["wan21-14b", "wan21-i2v-14b", "wan22-t2v-a14b",
                                                                        "wan22-i2v-a14b"]}.get(key, [key])
    for name in names:
        m = find_model(name)
        assert {"token_params_b": m.token_params_b, "kernels_per_fwd": m.kernels_per_fwd,
                "traffic_mb_per_token.forward": m.traffic_mb_per_token[0],
                "traffic_mb_per_token.backward": m.traffic_mb_per_token[1]} == counted, name


def test_flux_double_stream_and_modulation_weights_do_not_touch_every_token():
    """2 x parameters x tokens would count FLUX.1's adaLN modulation (run once a sample) and both
    streams of a double block (each token meets one) for every token: 84% too much work."""
    m = find_model("flux1-dev")
    assert m.token_params_b < 0.6 * m.trained_params_b
