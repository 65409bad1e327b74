"""The planner's estimates next to every published figure we have, with the error of each.

    PYTHONPATH=src python bench/plan_vram_vs_published.py

Prints two markdown tables (VRAM, then speed) that docs/planner.md reproduces. The baseline is
the published figure itself; the target is within +/-25% for VRAM. Rows marked "bound" are
published as a card size ("fits in 24 GB"), so the check is estimate <= bound, not an error.
"""

from __future__ import annotations

from dataclasses import dataclass

from lorapod.catalog.gpus import find_gpu
from lorapod.catalog.models import LLMArch, find_model
from lorapod.plan.speed import step_speed
from lorapod.plan.vram import Settings, estimate


@dataclass(frozen=True)
class Row:
    what: str
    source: str
    model: str | LLMArch
    settings: Settings
    published_gb: float
    kind: str = "peak"  # peak | bound

    def estimate_gb(self) -> float:
        m = find_model(self.model) if isinstance(self.model, str) else self.model
        return estimate(m, self.settings).peak_gb

    def error(self) -> float:
        return self.estimate_gb() / self.published_gb - 1


def S(dtype="bf16", r=16, targets="all-linear", opt="adamw_8bit", gc=True, batch=1, **kw) -> Settings:
    return Settings(dtype, r, targets if isinstance(targets, str) else tuple(targets), opt, gc, batch, **kw)


# Encoder-decoder models of the PEFT table, as decoder stacks of encoder + decoder layers.
T0_3B = LLMArch("bigscience/T0_3B", hidden=2048, layers=48, heads=32, kv_heads=32, head_dim=64,
                intermediate=5120, vocab=32128, tied=False, params_override=2.85e9)
MT0_XXL = LLMArch("bigscience/mt0-xxl", hidden=4096, layers=48, heads=64, kv_heads=64, head_dim=64,
                  intermediate=10240, vocab=250112, tied=False, params_override=12.9e9)
GPT3 = LLMArch("GPT-3 175B", hidden=12288, layers=96, heads=96, kv_heads=96, head_dim=128,
               intermediate=49152, vocab=50257, tied=True, gated_mlp=False)
# The PEFT example scripts behind the table train on RAFT twitter_complaints with batch_size 8 and
# max_length 64, in fp32.
PEFT = dict(dtype="fp32", r=8, targets=["q_proj", "v_proj"], opt="adamw", gc=False, batch=8, seq_len=64)
UNSLOTH = dict(batch=1, seq_len=512, gc=True, opt="adamw_8bit")

VRAM_ROWS = [
    Row("SDXL LoRA, U-Net only, cached latents + TE outputs, GC, AdamW8bit, r16, 1024 px, batch 1",
        "sd-scripts SDXL docs (via the guide): 8-10 GB", "sdxl", S(), 9.0),
    Row("FLUX.1 [dev] LoRA, 8-bit base + text encoder, GC, AdamW8bit, r16, 1024 px",
        "ai-toolkit train_lora_flux_24gb / sd-scripts 24 GB settings", "flux1-dev",
        S("fp8", cache_text_encoder_outputs=False), 24.0, "bound"),
    Row("FLUX.2 [klein] 4B LoRA, bf16, cached, GC, r16, 1024 px",
        "BFL klein LoRA guide: a LoRA fits in < 24 GB", "flux2-klein-4b", S(), 24.0, "bound"),
    Row("Wan2.1 T2V 14B LoRA, fp8 base, cached, GC, AdamW, r32, 960 px",
        "musubi-tuner: 24 GB recommended", "wan21-14b", S("fp8", r=32, opt="adamw", resolution=960), 24.0, "bound"),
    Row("T0_3B LoRA r8 (q,v), fp32", "PEFT README (A100 80GB): 14.4 GB", T0_3B, S(**PEFT), 14.4),
    Row("bloomz-7b1 LoRA r8, fp32", "PEFT README (A100 80GB): 32 GB", "bigscience/bloomz-7b1",
        S(**{**PEFT, "targets": ["query_key_value"]}), 32.0),
    Row("mt0-xxl LoRA r8 (q,v), fp32", "PEFT README (A100 80GB): 56 GB", MT0_XXL, S(**PEFT), 56.0),
    Row("Llama 3.2 3B QLoRA", "Unsloth requirements: 3B QLoRA 3.5 GB", "meta-llama/Llama-3.2-3B", S("nf4", **UNSLOTH), 3.5),
    Row("Llama 3.2 3B LoRA 16-bit", "Unsloth requirements: 3B LoRA 8 GB", "meta-llama/Llama-3.2-3B", S(**UNSLOTH), 8.0),
    Row("Mistral 7B QLoRA", "Unsloth requirements: 7B QLoRA 5 GB", "mistralai/Mistral-7B-v0.1", S("nf4", **UNSLOTH), 5.0),
    Row("Mistral 7B LoRA 16-bit", "Unsloth requirements: 7B LoRA 19 GB", "mistralai/Mistral-7B-v0.1", S(**UNSLOTH), 19.0),
    Row("Llama 3.1 8B QLoRA", "Unsloth requirements: 8B QLoRA 6 GB", "meta-llama/Llama-3.1-8B", S("nf4", **UNSLOTH), 6.0),
    Row("Llama 3.1 8B LoRA 16-bit", "Unsloth requirements: 8B LoRA 22 GB", "meta-llama/Llama-3.1-8B", S(**UNSLOTH), 22.0),
    Row("Qwen2.5 14B QLoRA", "Unsloth requirements: 14B QLoRA 8.5 GB", "Qwen/Qwen2.5-14B", S("nf4", **UNSLOTH), 8.5),
    Row("Qwen2.5 14B LoRA 16-bit", "Unsloth requirements: 14B LoRA 33 GB", "Qwen/Qwen2.5-14B", S(**UNSLOTH), 33.0),
    Row("Llama 3.1 70B QLoRA", "Unsloth requirements: 70B QLoRA 41 GB", "meta-llama/Llama-3.1-70B", S("nf4", **UNSLOTH), 41.0),
    Row("Llama 3.1 70B LoRA 16-bit", "Unsloth requirements: 70B LoRA 164 GB", "meta-llama/Llama-3.1-70B", S(**UNSLOTH), 164.0),
    Row("GPT-3 175B LoRA r4 (q,v), fp16, GC, seq 2048", "LoRA paper (Hu et al.): 350 GB", GPT3,
        S("fp16", r=4, targets=["q_proj", "v_proj"], opt="adamw", seq_len=2048), 350.0),
]


def speed_rows() -> list[tuple[str, str, str, str]]:
    """(what, published, ours, note)."""
    sdxl, klein, wan = find_model("sdxl"), find_model("flux2-klein-4b"), find_model("wan21-14b")
    g4090, h100, a100, l40s = (find_gpu(n) for n in ("RTX 4090", "H100 SXM", "A100 80GB", "L40S"))
    s_img = S()
    s_wan = S("fp8", r=32, opt="adamw", resolution=960)
    sdxl_its = step_speed(sdxl, s_img, g4090).it_per_s
    klein_min = 1800 * step_speed(klein, s_img, g4090).seconds_per_step / 60
    h_a = step_speed(sdxl, s_img, h100).it_per_s / step_speed(sdxl, s_img, a100).it_per_s
    h_l = step_speed(wan, s_wan, h100).it_per_s / step_speed(wan, s_wan, l40s).it_per_s
    wan_h = 1800 * step_speed(wan, s_wan, h100).seconds_per_step / 3600
    mistral = find_model("mistralai/Mistral-7B-v0.1")
    tok_s = step_speed(mistral, S(batch=2, seq_len=2048), find_gpu("RTX 3090")).tokens_per_s
    llm_h = [n * 500 * 3 * 0.9 / tok_s / 3600 for n in (500, 2000)]
    return [
        ("SDXL LoRA, RTX 4090, 1024 px, batch 1, GC", "1.1-1.4 it/s (kohya_ss #1288)", f"{sdxl_its:.2f} it/s",
         "calibration point"),
        ("FLUX.2 klein 4B, 1800 steps, RTX 4090", "under an hour (BFL)", f"{klein_min:.0f} min", "calibration point"),
        ("H100 vs A100, training", "2-3x (RunPod LLM guide)", f"{h_a:.2f}x", "sets the hopper/A100 class factors"),
        ("H100 vs L40S, Wan2.1 14B", "3-5x (RunPod vs Vast.ai guide)", f"{h_l:.2f}x", "sets the workstation class factor"),
        ("Wan2.1 14B, 100 epochs of 18 images at 960 px, H100", "2-8 h (guide; video clips)", f"{wan_h:.1f} h",
         "ours counts still images only: clips multiply tokens by their latent frames"),
        ("Mistral 7B LoRA, 500-2000 examples x 3 epochs, RTX 3090", "1-4 h (RunPod LLM guide)",
         f"{llm_h[0]:.1f}-{llm_h[1]:.1f} h", f"at 500 tokens/example, {tok_s:,.0f} tokens/s (LLM MFU is an assumption)"),
    ]


def main() -> None:
    print("| setting | published | estimate (GB) | error |")
    print("|---|---|---|---|")
    for r in VRAM_ROWS:
        est = r.estimate_gb()
        if r.kind == "bound":
            verdict = f"<= {r.published_gb:g} GB: {'yes' if est <= r.published_gb else 'NO'} ({r.error():+.0%})"
        else:
            verdict = f"{r.error():+.0%}"
        print(f"| {r.what} | {r.source} | {est:.1f} | {verdict} |")
    print()
    print("| speed | published | estimate | note |")
    print("|---|---|---|---|")
    for what, pub, ours, note in speed_rows():
        print(f"| {what} | {pub} | {ours} | {note} |")


if __name__ == "__main__":
    main()
