"""Count the U-Net figures of catalog/data/models.yaml on the architectures themselves.

    PYTHONPATH=src python bench/derive_architecture.py

Builds SD 1.5's and SDXL's U-Net and VAE, and the diffusion transformers (FLUX.1, FLUX.2 klein,
Wan), from their published configs on torch's meta device (no weights, no GPU; about 45 s on a
laptop CPU), with rank-16 LoRA on the attention projections, and prints, next to what the catalog
holds:
- forward TFLOPs at the reference resolution (attention's matmuls apart), VAE-encode TFLOPs;
- operators per forward (the planner's kernel-launch term);
- activation GiB at the reference resolution, batch 1, bf16, with and without gradient
  checkpointing (fused attention, cached latents and text embeddings);
- for the DiTs, the parameters each token's matmuls pass through (their work is 2 x that x the
  tokens; FLUX.1's 11.9e9 parameters give 6.48e9 a token) and operators per forward;
- for transformers' Llama layer, the bytes its memory-bound operators (everything but the
  matmuls and attention) move per token, forward and backward;
- for a GPTQ base, the bytes AutoGPTQ's unpacking moves per weight and its kernels per layer
  (plan/work.py holds them).
A test (tests/test_plan_step_count.py) re-derives the same figures, so the catalog cannot drift from
the architectures. See plan/step_count.py (the counters), plan/counted_models.py and plan/counted_llm.py.
"""

from __future__ import annotations

from lorapod.catalog.models import find_model
from lorapod.plan.counted_llm import gptq_dequant, llama_layer_traffic
from lorapod.plan.counted_models import DIT_CONFIGS, FLUX1_VAE_CONFIG, dit_figures, unet_figures, vae_encode
from lorapod.plan.vram import Settings
from lorapod.plan.work import GPTQ_DEQUANT_BYTES, GPTQ_DEQUANT_KERNELS, layer_traffic


def main() -> None:
    rows = []
    for family, name in (("sd15", "SD 1.5"), ("sdxl", "SDXL base 1.0")):
        m = find_model(family)
        counted = unet_figures(family, m.ref_resolution)
        catalog = {
            "fwd_tflops_at_ref": m.fwd_tflops_at_ref, "attn_tflops_at_ref": m.attn_tflops_at_ref,
            "kernels_per_fwd": m.kernels_per_fwd, "vae_encode_tflops_at_ref": m.vae_encode_tflops_at_ref,
            "activations_gb_at_ref.checkpointing": m.activations_gc_gb,
            "activations_gb_at_ref.no_checkpointing": m.activations_full_gb,
            "traffic_gb_at_ref.forward": m.traffic_gb_at_ref[0], "traffic_gb_at_ref.backward": m.traffic_gb_at_ref[1],
        }
        rows += [(name, key, catalog[key], value) for key, value in counted.items()]
    for key in DIT_CONFIGS:
        name = {"flux1": "flux1-dev"}.get(key, key)
        m = find_model(name)
        counted = dit_figures(key)
        rows += [(m.name, "token_params_b", m.token_params_b, counted["token_params_b"]),
                 (m.name, "kernels_per_fwd", m.kernels_per_fwd, counted["kernels_per_fwd"]),
                 (m.name, "traffic_mb_per_token.forward", m.traffic_mb_per_token[0],
                  counted["traffic_mb_per_token.forward"]),
                 (m.name, "traffic_mb_per_token.backward", m.traffic_mb_per_token[1],
                  counted["traffic_mb_per_token.backward"])]
    import importlib
    import pkgutil

    from lorapod.catalog.models import load_models
    from lorapod.engine.diffusion import families as family_pkg
    from lorapod.plan.counted_models import count_dit

    for info in pkgutil.iter_modules(family_pkg.__path__):  # families whose folder holds arch.py
        if not info.ispkg:
            continue
        try:
            arch = importlib.import_module(f"{family_pkg.__name__}.{info.name}.arch")
        except ModuleNotFoundError:
            continue
        counted = count_dit(arch.dit())
        for m in (m for m in load_models()[1] if m.family == info.name):
            rows += [(m.name, "token_params_b", m.token_params_b, counted["token_params_b"]),
                     (m.name, "kernels_per_fwd", m.kernels_per_fwd, counted["kernels_per_fwd"]),
                     (m.name, "traffic_mb_per_token.forward", m.traffic_mb_per_token[0],
                      counted["traffic_mb_per_token.forward"]),
                     (m.name, "traffic_mb_per_token.backward", m.traffic_mb_per_token[1],
                      counted["traffic_mb_per_token.backward"])]
    flux = find_model("flux1-dev")
    rows.append(("FLUX.1 (VAE only)", "vae_encode_tflops_at_ref", flux.vae_encode_tflops_at_ref,
                 round(vae_encode(flux.ref_resolution, FLUX1_VAE_CONFIG).tflops, 2)))
    llama = find_model("meta-llama/Llama-3.1-8B")
    fwd, bwd = llama_layer_traffic(llama.hidden, llama.intermediate, llama.heads, llama.kv_heads, llama.head_dim,
                                   tokens=1024)
    plain = Settings(base_dtype="bf16", r=8, targets=(), optimizer="adamw", gradient_checkpointing=False, batch=1)
    rows.append((llama.name, "memory-bound bytes per token per layer (forward + backward)",
                 round(layer_traffic(llama, plain, 1)), round(fwd + bwd)))
    gptq = gptq_dequant(4, 4096, 4096)
    rows += [("GPTQ 4-bit (AutoGPTQ)", "dequant bytes per weight", GPTQ_DEQUANT_BYTES, round(gptq.bytes / 4096**2, 2)),
             ("GPTQ 4-bit (AutoGPTQ)", "dequant kernels per linear", GPTQ_DEQUANT_KERNELS, gptq.kernels)]
    print("| model | figure | catalog | counted |\n|---|---|---|---|")
    for name, key, have, counted in rows:
        print(f"| {name} | {key} | {have} | {counted} |")


if __name__ == "__main__":
    main()
