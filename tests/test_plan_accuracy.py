"""The planner against published measurements it was not fitted to, and the physics under it.

No test here asserts a figure the model was solved from: speed is checked on sources held out
of the fit (leave-one-source-out), memory (which has no fitted part) on every published point,
and the physics tests are arithmetic on given inputs.

The accuracy floors are change detectors on the dataset as it stands, not a claim of accuracy:
each is set at the level the model reaches (the "achieved" beside it), so a change that makes
held-out accuracy worse fails, and so does a new measurement that moves a figure below its floor
(then the floor is re-read, with the reason, in docs/planner.md). The counts of points and
sources are floors on the dataset's size in the same way. How the figures moved, and why, is in
docs/planner.md ("Accuracy on published measurements", "How the held-out figures moved").
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import replace

import pytest

from lorapod.catalog.gpus import find_gpu
from lorapod.catalog.models import find_model
from lorapod.plan.fit import fit, held_out, predict_obs, range_holds, speed_points
from lorapod.plan.measurements import load_measurements
from lorapod.plan.speed import predict
from lorapod.plan.vram import GiB, Settings, estimate
from lorapod.plan.work import step_work


@pytest.fixture(autouse=True)
def _isolate(tmp_path, monkeypatch):
    monkeypatch.setenv("LORAPOD_HOME", str(tmp_path / "home"))


@pytest.fixture(scope="module")
def residuals():
    return held_out()


def test_dataset_has_forty_sourced_points_of_every_family():
    snap, obs = load_measurements()
    assert snap.date.isoformat() == "2026-12-01"
    points = {(o.source.id, o.what, o.settings) for o in obs}
    assert len(points) >= 40
    for o in obs:
        assert o.source.url.startswith(("https://", "file://")) and len(o.source.read) > 10
    families = {(o.is_speed, type(o.model).__name__, getattr(o.model, "is_video", False)) for o in obs}
    assert (True, "LLMArch", False) in families and (True, "ImageModel", False) in families
    assert (True, "ImageModel", True) in families  # a video point
    assert len({o.source.id for o in obs}) >= 10


def test_a_source_held_out_is_predicted_by_the_others():
    """Fit without LLaMA-Factory's table; its eight Unsloth QLoRA points are then out-of-sample."""
    train = [o for o in speed_points() if o.source.id != "llamafactory-wiki"]
    params = fit(train)
    held = [o for o in speed_points() if o.source.id == "llamafactory-wiki" and o.settings.framework == "unsloth"]
    assert len(held) == 8
    errors = [predict_obs(o, params) / o.value - 1 for o in held]
    assert sum(abs(e) <= 0.25 for e in errors) >= 5, errors
    assert all(abs(e) < 0.6 for e in errors), errors


# The targets (75% of held-out speed points within 20%, 80% of VRAM points within 25%)
# are NOT met: the floors below are the levels reached (docs/planner.md, "Where it misses").


def test_leave_one_source_out_speed(residuals):
    speed = [r for r in residuals if r.metric == "speed" and not r.obs.is_bound and r.obs.metric != "speed_ratio"]
    assert len(speed) >= 100
    assert len({r.obs.source.id for r in speed}) >= 20
    within = sum(r.ok for r in speed) / len(speed)
    assert within >= 0.60  # achieved 75/125
    assert sorted(abs(r.error) for r in speed)[len(speed) // 2] <= 0.18  # achieved 17%
    llm = [r for r in speed if r.family == "llm"]
    assert sum(r.ok for r in llm) / len(llm) >= 0.72  # achieved 55/76
    video = [r for r in speed if r.family == "video"]
    assert sum(r.ok for r in video) / len(video) >= 0.33  # achieved 5/15


# Per model family (issue 26's targets: speed within 20% on 75%, VRAM within 25% on 80%, the range
# holding 80%, each family apart): the levels reached, as floors; docs/planner.md tables them with
# the points that miss and why. None of the four meets both speed targets.
FAMILY_FLOORS = {("speed", "SD/SDXL"): 0.52, ("speed", "FLUX"): 0.22, ("speed", "Wan"): 0.33, ("speed", "LLM"): 0.72,
                 ("vram", "SD/SDXL"): 0.62, ("vram", "FLUX"): 0.77, ("vram", "Wan"): 0.62, ("vram", "LLM"): 0.68}


def test_each_model_family_holds_its_level(residuals):
    from lorapod.plan.fit import model_family

    for (metric, fam), floor in FAMILY_FLOORS.items():
        mine = [r for r in residuals if r.metric == metric and model_family(r.obs.model) == fam
                and not r.obs.is_bound and r.obs.metric != "speed_ratio"]
        assert len(mine) >= 8, (metric, fam)
        assert sum(r.ok for r in mine) / len(mine) >= floor, (metric, fam)


def test_held_out_gpu_ratios_come_from_other_sources_steps(residuals):
    """Without the source that has two GPUs side by side, their factors come from the other
    sources' steps. Hopper's come from NeMo's, NeMo AutoModel's, SimpleTuner's and the Hugging
    Face FLUX blog's H100 steps: they make the H100 about 3x an A100 where Universal LLM Trainer
    measured 1.5-1.8x (its loop is 3-5x slower per FLOP than anyone else's): within 55%, not 20%.
    H2O LLM Studio's A10G / A100 ratios are the A10G's only evidence, within 35% held out."""
    ratios = [r for r in residuals if r.obs.metric == "speed_ratio"]
    hopper = [r for r in ratios if r.obs.source.id == "universal-llm-trainer"]
    assert len(hopper) == 5
    assert all(r.estimate < r.obs.value for r in hopper)  # the H100 always comes out the faster card
    assert all(abs(r.error) < 0.55 for r in hopper)
    a10g = [r for r in ratios if r.obs.source.id == "h2o-llmstudio-performance"]
    assert len(a10g) == 3 and all(r.estimate > 1.5 for r in a10g)  # the A10G always the slower card
    assert all(abs(r.error) < 0.35 for r in a10g)


def test_leave_one_source_out_vram(residuals):
    vram = [r for r in residuals if r.metric == "vram" and not r.obs.is_bound]
    assert len(vram) >= 200
    assert sum(r.ok for r in vram) / len(vram) >= 0.68  # achieved 168/247
    image = [r for r in vram if r.family == "image"]
    assert sum(r.ok for r in image) / len(image) >= 0.68  # achieved 17/25
    assert all(r.ok for r in residuals if r.metric == "vram" and r.obs.is_bound)


def test_printed_ranges_hold_held_out_figures(residuals):
    """The printed range is the honest part: it is as wide as the held-out errors of other sources."""
    by_source = defaultdict(list)
    for r in residuals:
        by_source[r.obs.source.id].append(r)
    holds = range_holds(by_source)
    floors = {"speed": 0.87, "vram": 0.82}  # achieved 109/125 and 204/247
    for metric, floor in floors.items():
        mine = [ok for r, ok in holds if r.metric == metric]
        assert sum(mine) / len(mine) >= floor, metric


# ---------------------------------------------------------------------------- physics


def _llm(seq, **kw):
    return Settings(kw.pop("dtype", "bf16"), 16, "all-linear", "adamw", kw.pop("gc", True), 1, seq_len=seq, **kw)


def test_attention_grows_with_the_square_of_the_tokens():
    m = find_model("meta-llama/Llama-3.1-8B")
    short, long = step_work(m, _llm(4096)), step_work(m, _llm(8192))
    assert long.attention_tflops == pytest.approx(4 * short.attention_tflops)
    assert long.matmul_tflops == pytest.approx(2 * short.matmul_tflops)
    # causal attention forward: 2 x layers x (heads x head_dim) x seq^2; x (1 + 2.5 + 1 recompute)
    assert short.attention_tflops == pytest.approx(2 * 32 * 4096 * 4096**2 * 4.5 / 1e12)


def test_video_counts_latent_frames_and_their_attention():
    wan = find_model("wan21-14b")
    img = Settings("fp8", 32, "all-linear", "adamw", True, 1, resolution=480)
    clip = replace(img, frames=81)
    assert wan.latent_frames(81) == 21
    assert wan.image_tokens(480, 81) == (480 / 16) ** 2 * 21
    w1, w81 = step_work(wan, img), step_work(wan, clip)
    assert w81.matmul_tflops == pytest.approx(21 * w1.matmul_tflops)
    tokens, text, passes = 900 * 21, 512, 1 + 2.5 + 1
    self_attn = 4 * tokens**2 * 5120 * 40  # every latent token attends to every other, 40 blocks
    cross = 4 * tokens * text * 5120 * 40  # and to the 512 text tokens
    assert w81.attention_tflops == pytest.approx((self_attn + cross) * passes / 1e12)


def test_checkpointing_adds_a_forward_and_saves_activations():
    m = find_model("meta-llama/Llama-3.1-8B")
    on, off = step_work(m, _llm(2048)), step_work(m, _llm(2048, gc=False))
    lora = m.lora_params(16, "all-linear")
    blocks = 2 * (m.linear_params + 2 * lora) * 2048 / 1e12  # one forward of the decoder blocks
    head = 2 * m.vocab * m.hidden * 2048 * 2 / 1e12  # LM head forward + input gradient, never recomputed
    assert off.matmul_tflops == pytest.approx(2 * blocks + head)
    assert on.matmul_tflops == pytest.approx(3 * blocks + head)
    assert estimate(m, _llm(2048)).parts["activations"] < estimate(m, _llm(2048, gc=False)).parts["activations"] / 5


def test_logits_are_counted_as_each_trainer_builds_them():
    m = find_model("meta-llama/Llama-3.1-8B")
    tokens, vocab = 4096, 128256
    parts = {fw: estimate(m, _llm(tokens, framework=fw)).parts for fw in ("hf", "torchtune", "unsloth", "lorapod")}
    # eager losses at the peak counted on their code (tests/test_plan_step_count.py), chunked ones as read
    assert parts["hf"]["logits + loss (hf)"] == pytest.approx(tokens * vocab * 12 / GiB, rel=1e-3)
    assert parts["torchtune"]["logits + loss (torchtune)"] == pytest.approx(tokens * vocab * 3 / GiB, rel=1e-3)
    assert parts["unsloth"]["logits + loss (unsloth)"] == 0
    half = estimate(m, _llm(tokens, framework="lorapod", label_fraction=0.5)).parts["logits + loss (lorapod)"]
    assert half == pytest.approx(tokens * vocab * 12 * 0.5 / GiB, rel=1e-3)
    # unsloth keeps the checkpoints in CPU RAM
    assert parts["unsloth"]["activations"] < parts["hf"]["activations"]


def test_uncached_encoders_and_block_swap_cost_time_not_compute():
    flux, gpu = find_model("flux1-dev"), find_gpu("RTX 4090")
    from lorapod.plan.fit import fitted

    base = Settings("fp8", 16, "all-linear", "adamw_8bit", True, 1, resolution=1024)
    t0 = predict(flux, base, gpu, fitted())[0]
    uncached = predict(flux, replace(base, cache_text_encoder_outputs=False, cache_latents=False), gpu, fitted())
    assert uncached[0] > t0 and uncached[1]["uncached encoders"] > 0
    swap = replace(base, blocks_to_swap=40)
    assert estimate(flux, swap).peak_gb < estimate(flux, base).peak_gb
    w = step_work(flux, swap)
    assert w.swap_gb == pytest.approx(11.9e9 * 1 * 40 / 57 * 2 / 1e9)
    assert predict(flux, swap, gpu, fitted())[0] >= max(t0, w.swap_gb / 25.0) * 0.999


def test_a_mix_of_buckets_averages_time_and_peaks_at_the_largest():
    flux, gpu = find_model("flux1-dev"), find_gpu("A40")
    from lorapod.plan.fit import fitted

    mix = Settings("fp8", 16, "all-linear", "adamw_8bit", True, 1, resolution=(512, 1024))
    each = [predict(flux, replace(mix, resolution=r), gpu, fitted())[0] for r in (512, 1024)]
    assert predict(flux, mix, gpu, fitted())[0] == pytest.approx(sum(each) / 2)
    assert estimate(flux, mix).peak_gb == estimate(flux, replace(mix, resolution=1024)).peak_gb


def test_fit_recovers_known_efficiencies_from_synthetic_points():
    """Points made by the model itself with known parameters: the fit must find them again."""
    from lorapod.plan.speed import Params

    truth = Params({"kind:llm": math.log(0.4), "arch:ada": 0.2, "arch:ampere": -0.1, "class:geforce": 0.0,
                    "class:a100": 0.0, "dequant:nf4": 1.2, "framework:hf": 0.0,
                    "attention": -0.2, "host:llm": math.log(10.0), "elementwise": -0.3})
    obs = [o for o in speed_points() if o.source.id in ("qwen-readme", "llamafactory-wiki", "torchtune-readme")]
    synthetic = [replace(o, value=predict(o.model, replace(o.settings, framework="hf"), o.gpu(), truth)[0],
                         settings=replace(o.settings, framework="hf")) for o in obs]
    got = fit(synthetic)
    errors = sorted(abs(predict(o.model, o.settings, o.gpu(), got)[0] / o.value - 1) for o in synthetic)
    assert errors[-1] < 0.10 and errors[len(errors) // 2] < 0.03  # ridge pulls terms a little towards 0
    # dequantisation found well below the memory bandwidth (the truth is 1.2; the ridge and GPTQ's
    # own term, which shares nf4's, take some of it: these three sources hold few nf4 steps)
    assert got.theta["dequant:nf4"] > 0.6


def test_a_gpu_architecture_without_measured_steps_gets_the_wider_range():
    from lorapod.plan.estimate import step_speed
    from lorapod.plan.fit import measured_archs, unseen_arch_spread

    m = find_model("meta-llama/Llama-3.1-8B")
    s = _llm(2048)
    # Every catalog architecture has a measured step now; a new one (a card not yet measured) does not.
    unseen = replace(find_gpu("H100 SXM"), arch="rubin")
    assert "rubin" not in measured_archs() and "ada" in measured_archs()
    new = step_speed(m, s, unseen, learn=False)
    rtx = step_speed(m, s, find_gpu("RTX 4090"), learn=False)
    lo, hi = unseen_arch_spread()
    assert new.low == pytest.approx(min(lo, rtx.low / rtx.seconds_per_step) * new.seconds_per_step)
    assert new.high == pytest.approx(max(hi, rtx.high / rtx.seconds_per_step) * new.seconds_per_step)
    # Never narrower than a measured architecture's (equal when the family's own spread is the wider).
    assert new.high / new.low >= rtx.high / rtx.low * (1 - 1e-9)


def test_no_published_step_claims_more_than_its_gpus_paper_peak():
    """A data check independent of the fit: a step time whose counted FLOPs exceed the GPU's paper
    bf16 peak cannot have run as stated (Stable-Video-Infinity #49 was left out for that), and the
    check does flag a made-up point that is too fast."""
    from lorapod.plan.fit import peak_share

    steps = [o for o in load_measurements()[1] if o.metric == "seconds_per_step" and o.gpu_name]
    assert len(steps) >= 30
    shares = {o.what: peak_share(o) for o in steps}
    assert all(0.0 < s < 1.0 for s in shares.values()), shares
    too_fast = replace(steps[0], value=steps[0].value * peak_share(steps[0]) / 1.5)
    assert peak_share(too_fast) == pytest.approx(1.5)


def test_fp8_matmuls_run_at_the_fp8_peak_only_where_there_are_fp8_tensor_cores():
    from dataclasses import replace

    from lorapod.catalog.gpus import find_gpu
    from lorapod.plan.fit import fitted
    from lorapod.plan.speed import MAX_EFFICIENCY, efficiencies, features, predict

    m = find_model("meta-llama/Llama-3.1-8B")
    bf16 = _llm(4096, gc=False)
    fp8 = replace(bf16, fp8_matmuls=True)
    h100, a100 = find_gpu("H100 SXM"), find_gpu("A100 80GB")
    params = fitted()
    t_bf16, parts_bf16, _ = predict(m, bf16, h100, params)
    t_fp8, parts_fp8, _ = predict(m, fp8, h100, params)
    assert "compute:fp8" in features(m, fp8, h100) and "compute:fp8" not in features(m, fp8, a100)
    ratio = parts_fp8["matmul compute"] / parts_bf16["matmul compute"]
    e_bf16, e_fp8 = (efficiencies(features(m, s, h100), params)[0] for s in (bf16, fp8))
    assert e_fp8 == pytest.approx(min(MAX_EFFICIENCY, e_bf16 * math.exp(params.theta["compute:fp8"])))
    assert ratio == pytest.approx(0.5 * e_bf16 / e_fp8)  # twice the peak, at fp8's own efficiency
    assert parts_fp8["attention compute"] == parts_bf16["attention compute"]  # attention stays bf16
    assert predict(m, fp8, a100, params)[0] == predict(m, bf16, a100, params)[0]  # Ampere has no fp8 cores
    assert t_fp8 < t_bf16


def test_block_swap_time_is_max_when_the_trainer_prefetches_else_the_sum(monkeypatch):
    """G12: a trainer that copies each block on the compute stream right before it runs pays copy +
    compute; one that prefetches the next block on a side stream (kohya's offloader; lorapod's
    engine on CUDA, engine/diffusion/wan.py) pays the larger of the two."""
    from lorapod.plan import frameworks
    from lorapod.plan.fit import fitted

    wan, gpu = find_model("wan21-14b"), find_gpu("RTX 4090")
    s = Settings("fp8", 16, "all-linear", "adamw_8bit", True, 1, resolution=960, blocks_to_swap=20, framework="lorapod")
    assert frameworks.framework("lorapod").prefetches_blocks
    t_overlap, parts, _ = predict(wan, s, gpu, fitted())
    swap_s = step_work(wan, s).swap_gb / 25.0
    core = sum(v for k, v in parts.items() if not k.startswith("block swap"))
    assert t_overlap == pytest.approx(max(core, swap_s), rel=1e-6)
    monkeypatch.setitem(frameworks.FRAMEWORKS, "lorapod",
                        replace(frameworks.FRAMEWORKS["lorapod"], prefetches_blocks=False))
    t_serial, parts, _ = predict(wan, s, gpu, fitted())
    assert t_serial == pytest.approx(core + swap_s, rel=1e-6)
    assert parts["block swap (copies, not overlapped)"] == pytest.approx(swap_s)


def test_lorapod_block_swap_counts_the_two_blocks_in_transit():
    """lorapod's engine holds the computing swapped block and the prefetched next one on the GPU;
    kohya's offloader exchanges a leaving block's weights into the arriving one's buffers."""
    wan = find_model("wan21-14b")
    s = Settings("bf16", 16, "all-linear", "adamw", True, 1, resolution=960, blocks_to_swap=20)
    ours = estimate(wan, replace(s, framework="lorapod"))
    musubi = estimate(wan, replace(s, framework="musubi-tuner"))
    weights = next(v for k, v in ours.parts.items() if k.startswith("base weights"))
    assert ours.parts["block swap (blocks in transit)"] == pytest.approx(weights * 2 / wan.blocks, rel=1e-3)
    assert "block swap (blocks in transit)" not in musubi.parts
