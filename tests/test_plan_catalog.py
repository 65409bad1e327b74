"""The packaged catalogs: dated, sourced, consistent, and forgiving about how names are spelled."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest

from lorapod.catalog.gpus import find_gpu, load_gpus
from lorapod.catalog.models import ImageModel, find_model, load_models
from lorapod.catalog.prices import load_prices, load_storage
from lorapod.catalog.snapshot import load_data
from lorapod.compute.live_prices import match_gpu
from lorapod.plan.choose import plan_job
from lorapod.spec import load_spec

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
REQUIRED_GPUS = ["RTX 3090", "RTX 4090", "RTX 5090", "RTX A6000", "A40", "L4", "L40S", "A100 40GB", "A100 80GB",
                 "H100 PCIe", "H100 SXM", "H200"]


@pytest.fixture(autouse=True)
def _isolate(tmp_path, monkeypatch):
    monkeypatch.setenv("LORAPOD_HOME", str(tmp_path / "home"))


@pytest.mark.parametrize("name", ["gpus", "models", "prices", "storage"])
def test_every_data_file_is_dated_and_sourced(name):
    snap, _ = load_data(name)
    assert snap.date == dt.date(2026, 9, 15)
    assert len(snap.source) > 20
    assert snap.age_days(dt.date(2026, 9, 25)) == 10
    assert "10 days old" in snap.describe(dt.date(2026, 9, 25))


def test_gpu_catalog_has_every_card_the_guides_use():
    _, gpus = load_gpus()
    names = [g.name for g in gpus]
    assert set(REQUIRED_GPUS) <= set(names)
    assert len(names) == len(set(names))
    for g in gpus:
        assert g.vram_gb > 0 and g.bf16_tflops > 0 and g.mem_bw_gbs > 0 and g.arch
    assert find_gpu("RTX 5090").requires["torch"] == "2.8.0"
    assert find_gpu("H200").vram_gb == 141


@pytest.mark.parametrize(("spelled", "name"), [
    ("4090", "RTX 4090"), ("RTX_4090", "RTX 4090"), ("NVIDIA GeForce RTX 4090", "RTX 4090"),
    ("H100 80GB HBM3", "H100 SXM"), ("NVIDIA H100 PCIe", "H100 PCIe"), ("nvidia l40s", "L40S"),
])
def test_gpu_names_as_providers_spell_them(spelled, name):
    assert find_gpu(spelled).name == name


def test_provider_names_with_memory():
    assert match_gpu("A100 PCIE", 80).name == "A100 80GB"
    assert match_gpu("A100 SXM4", 40).name == "A100 40GB"
    assert match_gpu("A100 SXM", 80).name == "A100 80GB"
    assert match_gpu("MI300X", 192) is None


def test_prices_are_the_guides():
    _, prices = load_prices()
    by = {(p.provider, p.tier, p.gpu): p.usd_per_hour for p in prices}
    assert by[("vast", "from", "RTX 4090")] == 0.31
    assert by[("runpod", "price_page", "RTX 4090")] == 0.74
    assert by[("runpod", "cheapest_seen", "RTX 3090")] == 0.22
    assert by[("runpod", "price_page", "A100 80GB")] == 1.59
    assert by[("runpod", "price_page", "L40S")] == 0.99
    _, st = load_storage()
    assert st["runpod"]["volume_disk"]["stopped"] == 0.20 and st["runpod"]["network_volume"]["always"] == 0.07


def test_model_families_and_licenses():
    _, images, _ = load_models()
    fams = {(m.family, m.variant) for m in images}
    assert {("sd15", None), ("sdxl", None), ("flux1", "dev"), ("flux1", "schnell"), ("flux2", "4b"), ("flux2", "9b"),
            ("wan21", "1.3b"), ("wan21", "14b")} <= fams
    dev = find_model("flux1-dev")
    assert isinstance(dev, ImageModel) and dev.license.gated and not dev.license.commercial
    klein = find_model("x", "flux2", "4b")
    assert klein.license.name == "Apache-2.0" and klein.license.gated is False
    # FLUX.2 klein 4B: a 3.89e9 transformer (5 + 20 blocks at width 3072) and Qwen3-4B, about 16 GB of
    # bf16 weights (flux2.c's README: "~16GB total"; BFL's "about 13 GB" was read as weights before).
    assert (klein.trained_params_b + klein.text_encoder_params_b) * 2 == pytest.approx(16, rel=0.05)
    assert klein.attn_blocks == 25 and klein.hidden == 3072
    assert find_model("stabilityai/stable-diffusion-xl-base-1.0").download_gb == 6.9
    assert find_model("/models/sd_xl_base_1.0.safetensors").family == "sdxl"
    assert find_model("NousResearch/Llama-3.2-1B").license.gated is False
    assert find_model("meta-llama/Llama-3.2-1B").license.gated is True


@pytest.mark.parametrize(("model_id", "billions"), [
    ("meta-llama/Llama-3.2-1B", 1.24), ("meta-llama/Llama-3.1-8B", 8.03), ("mistralai/Mistral-7B-v0.1", 7.24),
    ("Qwen/Qwen2.5-7B", 7.62), ("meta-llama/Llama-3.1-70B", 70.55),
])
def test_llm_sizes_from_config_match_the_model_cards(model_id, billions):
    assert find_model(model_id).params / 1e9 == pytest.approx(billions, rel=0.01)


def test_stale_prices_are_flagged():
    spec = load_spec(EXAMPLES / "sdxl-object-lora.yaml")
    fresh = plan_job(spec, images=25, today=dt.date(2026, 10, 1))
    old = plan_job(spec, images=25, today=dt.date(2027, 6, 1))
    # a price with its own date (prices.yaml as_of) is aged from that date, the rest from the snapshot's
    dated = {(p.provider, p.tier, p.gpu): p.as_of for p in load_prices()[1] if p.as_of and not p.interruptible}
    plain = [o for o in fresh.options if (o.provider, o.tier, o.gpu) not in dated]
    assert plain and all(any("(16 days old)" in w for w in o.warnings) for o in plain)
    assert all(any(f"price as of {dated[(o.provider, o.tier, o.gpu)]}, its own source" in w for w in o.warnings)
               for o in fresh.options if o not in plain)
    assert not any("stale" in w for o in plain for w in o.warnings)
    assert all(any("days old): stale, check --live" in w for w in o.warnings) for o in old.options)
    assert fresh.snapshot_date == "2026-09-15"


def test_llm_config_from_the_hugging_face_cache(tmp_path, monkeypatch):
    import json

    snap = tmp_path / "hub" / "models--acme--tiny-chat" / "snapshots" / "abc123"
    snap.mkdir(parents=True)
    (snap / "config.json").write_text(json.dumps({
        "model_type": "qwen2", "hidden_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4,
        "intermediate_size": 512, "vocab_size": 500,
    }))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    m = find_model("acme/tiny-chat")
    assert m.hidden == 256 and m.layers == 2 and m.kv_heads == 4 and not m.tied
    assert m.params == 2 * (4 * 256 * 256 + 3 * 256 * 512 + 2 * 256) + 2 * 500 * 256 + 256


def test_a_diffusers_folder_is_recognised(tmp_path):
    import json

    (tmp_path / "model_index.json").write_text(json.dumps({"_class_name": "StableDiffusionXLPipeline"}))
    assert find_model(str(tmp_path)).family == "sdxl"


def test_planning_the_demo_model_says_what_it_is_instead_of_unknown_model():
    from lorapod.errors import PlanError

    with pytest.raises(PlanError) as err:
        plan_job(load_spec(Path(__file__).resolve().parents[1] / "examples" / "demo.yaml"))
    assert "'lorapod:tiny-llama' is lorapod's built-in demo model" in err.value.message
    assert "lorapod demo" in (err.value.hint or "") and "unknown model" not in err.value.message


def test_the_measurements_own_gpus_load_with_their_class_and_arch():
    """GPUs only the measurements name (catalog/data/measurements.yaml ``gpus:``) are built field by
    field: a positional build once slid ``class`` into ``aliases`` when a GPU field was removed, and
    the speed fit quietly lost the class term of those cards."""
    from lorapod.catalog.snapshot import load_data
    from lorapod.plan.measurements import gpu_by_name

    raw = load_data("measurements")[1].get("gpus", [])
    assert raw
    for g in raw:
        got = gpu_by_name(g["name"])
        assert (got.gpu_class, got.arch, got.aliases) == (g["class"], g["arch"], ())


def test_rtx_4080_rtx_a5000_and_l4_are_known_with_their_published_figures():
    """Issue 48, F25: the three cards a newcomer met as unknown or unpriced."""
    spec = {g: find_gpu(g) for g in ("RTX 4080", "RTX A5000", "L4")}
    assert (spec["RTX 4080"].vram_gb, spec["RTX 4080"].bf16_tflops, spec["RTX 4080"].mem_bw_gbs) == (16, 97.5, 716.8)
    assert (spec["RTX A5000"].vram_gb, spec["RTX A5000"].bf16_tflops, spec["RTX A5000"].mem_bw_gbs) == (24, 111.1, 768)
    assert spec["L4"].vram_gb == 24
    assert find_gpu("NVIDIA RTX A5000").name == "RTX A5000" and find_gpu("NVIDIA GeForce RTX 4080").name == "RTX 4080"
    _, prices = load_prices()
    by = {(p.provider, p.tier, p.gpu): p for p in prices}
    assert by[("runpod", "cheapest_seen", "RTX A5000")].usd_per_hour == 0.16
    assert by[("runpod", "price_page", "RTX A5000")].usd_per_hour == 0.27
    assert by[("runpod", "price_page", "L4")].usd_per_hour == 0.78
    # each added figure carries its own date (the plan says it instead of the snapshot's)
    assert all(by[k].as_of for k in [("runpod", "cheapest_seen", "RTX A5000"), ("runpod", "price_page", "L4")])
    raw = load_data("prices")[1]
    added = [p for p in raw["prices"] if p["gpu"] in ("RTX A5000", "L4")]
    assert added and all(p.get("as_of") and p.get("source") for p in added)


def test_a_name_two_cards_share_is_never_read_as_one_of_them_silently():
    """Issue 48, F25: "A100 PCIe" is made with 40 GB and 80 GB: the memory a provider lists picks
    the card; without it the name is refused, naming both."""
    from lorapod.errors import PlanError

    for name in ("A100 PCIe", "A100", "A100 SXM4", "NVIDIA A100 PCIe"):
        with pytest.raises(PlanError, match="made with 40 GB and 80 GB") as exc:
            find_gpu(name)
        assert "A100 40GB" in (exc.value.hint or "") and "A100 80GB" in (exc.value.hint or "")
    assert find_gpu("A100 PCIe", 80).name == "A100 80GB"
    assert find_gpu("A100 PCIe", 40).name == "A100 40GB"
    assert find_gpu("A100 80GB").name == "A100 80GB"  # its own name stays exact


def test_run_plans_a_shared_name_offer_as_the_card_its_memory_says():
    from lorapod.compute.offers import choose_offers, planned_job
    from lorapod.compute.provider import Offer
    from lorapod.spec import load_spec

    class Market:
        name = "newcomer"

        def offers(self, req):
            return [Offer(self.name, "a80", "A100 PCIe", 1.19, 80), Offer(self.name, "a40", "A100 PCIe", 1.19, 40)]

    spec = load_spec(Path(__file__).resolve().parents[1] / "examples" / "wan21-video-lora.yaml",
                     ["model.dtype=bf16", "train.blocks_to_swap=0", "train.optimizer=adamw", "method.r=128",
                      "data.resolution=1280"])
    job = planned_job(spec)
    ranked = choose_offers(spec, Market(), job=job)
    assert 40 < job.estimate.peak_gb < 80
    assert [r.offer.id for r in ranked] == ["a80"]  # the 40 GB card cannot hold it: not planned as an 80 GB one
