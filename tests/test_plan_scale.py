"""N GPUs per instance: the planner's price and time, the offers asked for, the job command."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from lorapod.compute.launch import job_command_for
from lorapod.compute.offers import requirements
from lorapod.compute.provider import InstanceSpec
from lorapod.compute.remote import default_job_command
from lorapod.compute.runpod.provider import RunPodProvider
from lorapod.plan.choose import plan_job
from lorapod.plan.scale import SCALING_EFFICIENCY
from lorapod.spec import load_spec

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def _train_hours(option) -> float:
    return next(p.hours for p in option.phases if p.name == "train")


def test_planner_prices_n_gpus_with_its_stated_efficiency():
    one = plan_job(load_spec(EXAMPLES / "llm-chat-lora.yaml"), examples=2000, gpu="A100 80GB", provider="runpod")
    two = plan_job(load_spec(EXAMPLES / "llm-chat-lora.yaml", ["compute.gpus=2"]), examples=2000,
                   gpu="A100 80GB", provider="runpod")
    by_tier = {o.tier: o for o in one.options}
    for o in two.options:
        single = by_tier[o.tier]
        assert o.usd_per_hour == pytest.approx(2 * single.usd_per_hour)
        assert _train_hours(o) == pytest.approx(_train_hours(single) / (2 * SCALING_EFFICIENCY))
        assert any(f"2 x A100 80GB at ${single.usd_per_hour:.3f}/h each" in w and "90%" in w for w in o.warnings)


class _Api:
    """RunPod's API client, answering gpu_types and recording the create body."""

    base_url = "http://runpod.invalid"

    def __init__(self) -> None:
        self.bodies: list[dict] = []

    def gpu_types(self):
        return [{"id": "NVIDIA A100 80GB PCIe", "displayName": "A100 80GB", "memoryInGb": 80,
                 "securePrice": 1.5, "communityPrice": 1.2,
                 "lowestPrice": {"uninterruptablePrice": 1.2}}]  # in stock (runpodctl's ListGpuTypes filter)

    def create_pod(self, body):
        self.bodies.append(body)
        return {"id": "p1", "desiredStatus": "RUNNING"}


def test_runpod_rents_n_gpus_at_n_times_the_price():
    api = _Api()
    prov = RunPodProvider(api)  # type: ignore[arg-type]
    spec = load_spec(EXAMPLES / "llm-chat-lora.yaml", ["compute.gpus=4"])
    req = requirements(spec, gpu="A100", job=None)
    assert req.gpu_count == 4
    offers = prov.offers(req)
    assert sorted((o.usd_per_hour, o.gpu_count) for o in offers) == [(4.8, 4), (6.0, 4)]
    prov.create(offers[0], InstanceSpec(label="j", ssh_public_key="ssh-ed25519 AAAA"))
    assert api.bodies[0]["gpuCount"] == 4


def test_job_command_runs_under_torchrun_for_n_gpus(monkeypatch):
    from torch.distributed.run import get_args_parser

    monkeypatch.delenv("LORAPOD_JOB_COMMAND", raising=False)
    assert job_command_for(1)("python3", "spec.yaml", "run", False) == default_job_command("python3", "spec.yaml", "run", False)
    argv = job_command_for(2)("python3", "spec.yaml", "run", False)
    assert argv[:3] == ["python3", "-m", "torch.distributed.run"]
    args = get_args_parser().parse_args(argv[3:])
    assert (args.nproc_per_node, args.standalone, args.module, args.training_script) == ("2", True, True, "lorapod")
    assert args.training_script_args == ["train", "spec.yaml", "--run-dir", "run"]
    own = [sys.executable, "my_trainer.py", "spec.yaml"]
    assert job_command_for(2, lambda *a: own)("python3", "spec.yaml", "run", False) == own


def test_planner_shards_the_base_with_fsdp_when_it_does_not_fit_one_gpu():
    """Llama-3.1-8B LoRA in bf16 (~26.7 GB by the planner) does not fit a 24 GB RTX 4090; with 2
    GPUs, train.parallel auto plans FSDP2: per GPU, half the base weights less (docs/scale.md)."""
    sets = ["model.id=meta-llama/Llama-3.1-8B", "method.type=lora"]
    one = plan_job(load_spec(EXAMPLES / "llm-chat-lora.yaml", sets), examples=2000, gpu="RTX 4090")
    whole = one.job.estimate
    assert whole.peak_gb > 24 and {o.verdict for o in one.options} == {"does-not-fit"}
    two = plan_job(load_spec(EXAMPLES / "llm-chat-lora.yaml", [*sets, "compute.gpus=2"]), examples=2000, gpu="RTX 4090")
    base = whole.parts["base weights (bf16)"]
    assert two.options and all(o.verdict != "does-not-fit" for o in two.options)
    for o in two.options:
        assert o.vram_peak_gb == pytest.approx(whole.peak_gb - base / 2, abs=0.01)
        assert any(w.startswith("FSDP2 (train.parallel auto): the planner's 26.7 GB does not fit one 24 GB GPU; "
                                "sharded over 2") for w in o.warnings)
    ddp = plan_job(load_spec(EXAMPLES / "llm-chat-lora.yaml", [*sets, "compute.gpus=2", "train.parallel=ddp"]),
                   examples=2000, gpu="RTX 4090")
    assert {o.verdict for o in ddp.options} == {"does-not-fit"}
    qlora = plan_job(load_spec(EXAMPLES / "llm-chat-lora.yaml", ["compute.gpus=2"]), examples=2000, gpu="RTX 4090")
    assert not any("FSDP2" in w for o in qlora.options for w in o.warnings)  # a 4-bit base is not sharded


def test_an_fsdp_job_asks_for_a_shards_vram_and_host_ram_for_one_base():
    """train.parallel fsdp on 4 GPUs: the offers are filtered by the per-GPU (sharded) peak, and by
    host RAM for the base once (rank 0 reads it, engine/fsdp.py broadcasts it), not once per GPU
    (review G14: every rank used to load the whole base into its own RAM). The plan says it."""
    from lorapod.compute.offers import host_ram_needed_gb, planned_job
    from lorapod.plan.scale import sharded

    sets = ["model.id=meta-llama/Llama-3.1-8B", "method.type=lora", "compute.gpus=4", "compute.gpu=null"]
    spec = load_spec(EXAMPLES / "llm-chat-lora.yaml", [*sets, "train.parallel=fsdp"])
    job = planned_job(spec)
    assert job is not None
    whole, base = job.estimate, job.estimate.parts["base weights (bf16)"]
    split = sharded(whole, 4)
    req = requirements(spec, job=job)
    assert req.min_vram_gb == round(split.peak_gb, 1) < whole.peak_gb
    total = req.host_ram_gb * 4  # providers ask per GPU (Vast multiplies by gpu_count)
    assert total == pytest.approx(base + 4 * 0.25 * split.peak_gb, abs=0.2)
    assert base < total < 4 * base  # one base (the old code read one per rank: at least 4 x base)
    ddp = requirements(load_spec(EXAMPLES / "llm-chat-lora.yaml", [*sets, "train.parallel=ddp"]), job=job)
    assert ddp.min_vram_gb == round(whole.peak_gb, 1) and ddp.host_ram_gb == host_ram_needed_gb(ddp.min_vram_gb)
    plan = plan_job(spec, examples=2000, gpu="RTX 4090")
    assert plan.options and all(any(w == f"host RAM ~{total:.0f} GB: rank 0 reads the base once and broadcasts it "
                                         "into the shards" for w in o.warnings) for o in plan.options)


def test_training_processes_pick_fsdp_when_the_planner_says_one_gpu_is_too_small(monkeypatch):
    """The run-time choice (engine/fsdp.py) reads this GPU's memory and the planner's estimate."""
    import torch

    from lorapod.engine.distributed import World
    from lorapod.engine.fsdp import parallel_mode
    from lorapod.errors import SpecError

    gib = {"n": 24}
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda _d: type("P", (), {"total_memory": gib["n"] * 1024**3})())
    spec = load_spec(EXAMPLES / "llm-chat-lora.yaml", ["model.id=meta-llama/Llama-3.1-8B", "method.type=lora"])
    cuda = torch.device("cuda", 0)
    mode, why = parallel_mode(spec, World(0, 2), cuda)
    assert mode == "fsdp" and why.startswith("FSDP2 (train.parallel auto): the planner's 26.7 GB does not fit one 24 GB GPU")
    gib["n"] = 80
    assert parallel_mode(spec, World(0, 2), cuda)[0] == "ddp"
    assert parallel_mode(spec, World(0, 2), torch.device("cpu"))[0] == "ddp"  # no GPU memory to compare with
    gib["n"] = 16  # 2 shards need ~19.2 GB each, 4 shards ~15.5 GB
    assert parallel_mode(spec, World(0, 2), cuda)[0] == "ddp"
    assert parallel_mode(spec, World(0, 4), cuda)[0] == "fsdp"
    with pytest.raises(SpecError, match="QLoRA"):
        parallel_mode(load_spec(EXAMPLES / "llm-chat-lora.yaml", ["train.parallel=fsdp"]), World(0, 2), cuda)
