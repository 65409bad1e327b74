"""Data-parallel training on torch.distributed (gloo, CPU) with the real torchrun launcher.

Two processes train the tiny LLM; their loss trajectory must equal one process's with the same
global batch (micro_batch_size x grad_accum). DDP sums the same per-micro-batch gradients in a
different order, so the tolerance is float32 rounding: rel 1e-5.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import yaml

from lorapod.engine.distributed import World, check_batch, torchrun_argv
from lorapod.engine.llm import train_llm
from lorapod.engine.metrics import read_metrics
from lorapod.errors import SpecError
from lorapod.rundir import RunDir
from lorapod.spec import load_spec

from .llm_fixtures import make_assets, spec_dict

TOL = {"rel": 1e-5, "abs": 1e-6}


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    return make_assets(tmp_path_factory.mktemp("ddp"))


def _spec_file(assets, out: Path, **train) -> Path:
    _root, model_dir, tr, va = assets
    d = spec_dict(model_dir, tr, va, out / "runs", epochs=2, **train)
    d["method"]["dropout"] = 0.0  # dropout masks differ between processes by design
    out.mkdir(parents=True, exist_ok=True)
    path = out / "spec.yaml"
    path.write_text(yaml.safe_dump(d))
    return path


def _one_process(spec_file: Path, out: Path) -> list[float]:
    spec = load_spec(spec_file)
    run = RunDir.create(out, "single")
    return train_llm(spec, run, device="cpu", show_progress=False, log=lambda m: None).result.losses


def _losses(run: Path) -> list[float]:
    return [r["loss"] for r in read_metrics(run / "metrics.jsonl") if "loss" in r]


def _lorapod(*args: str, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "lorapod", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, **kw)


def _finish(proc: subprocess.Popen, timeout: float = 240) -> str:
    out, _ = proc.communicate(timeout=timeout)
    text = out.decode(errors="replace")
    assert proc.returncode == 0, text[-3000:]
    return text


@pytest.fixture(scope="module")
def single(assets, tmp_path_factory):
    """The spec (grad_accum 2) and its one-process losses, trained in this process."""
    out = tmp_path_factory.mktemp("single")
    spec_file = _spec_file(assets, out)
    return spec_file, _one_process(spec_file, out / "runs1")


def test_torchrun_command_is_accepted_by_torchrun():
    from torch.distributed.run import get_args_parser

    one = torchrun_argv(4, ["train", "s.yaml"], python="py")
    assert one == ["py", "-m", "torch.distributed.run", "--nproc-per-node", "4", "--standalone",
                   "-m", "lorapod", "train", "s.yaml"]
    multi = torchrun_argv(2, ["train", "s.yaml"], python="py", nnodes=2, node_rank=1,
                          rdzv_endpoint="127.0.0.1:29400", rdzv_id="job")
    args = get_args_parser().parse_args(multi[3:])
    assert (args.nnodes, args.node_rank, args.rdzv_backend, args.rdzv_endpoint, args.rdzv_id, args.module) == \
        ("2", 1, "c10d", "127.0.0.1:29400", "job", True)
    assert args.training_script == "lorapod" and args.training_script_args == ["train", "s.yaml"]


def test_training_processes_exit_when_their_launcher_is_killed(tmp_path):
    """torchrun puts each rank in a session of its own; a SIGKILLed torchrun must not leave them running."""
    child = ("from lorapod.engine.distributed import _die_with_launcher; import time; "
             "_die_with_launcher(0.1); print('up', flush=True); time.sleep(120)")
    parent = subprocess.Popen([sys.executable, "-c", "import subprocess, sys, time; "
                               f"subprocess.Popen([sys.executable, '-c', {child!r}], start_new_session=True); "
                               "time.sleep(120)"], stdout=subprocess.PIPE)
    try:
        assert parent.stdout.readline() == b"up\n"
        (rank,) = psutil.Process(parent.pid).children()
    finally:
        parent.kill()
        parent.wait()
    _gone, alive = psutil.wait_procs([rank], timeout=10)
    assert alive == []


def test_processes_leave_the_group_and_exit_cleanly(tmp_path):
    """A gloo process that exits with its group still up aborts in the group's destructor about
    half the time ("terminate called without an active exception"): a finished run would then
    fail. After leave() every launch of 2 processes exits 0."""
    script = tmp_path / "job.py"
    script.write_text("from lorapod.engine import distributed\n"
                      "world, _ = distributed.init('cpu')\n"
                      "for _ in range(20):\n"
                      "    assert world.all_sum([1.0]) == [2.0]\n"
                      "distributed.leave()\n")
    launches = [subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                                  "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{_free_port()}",
                                  str(script)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
                for _ in range(6)]
    for p in launches:
        out, _ = p.communicate(timeout=120)
        assert p.returncode == 0, out.decode(errors="replace")[-2000:]


def test_window_shares_and_batch_check():
    assert World(1, 2).share([0, 1, 2]) == [1] and World(0, 2).share([0, 1, 2]) == [0, 2]
    check_batch(World(0, 2), 2)
    with pytest.raises(SpecError, match="grad_accum"):
        check_batch(World(0, 4), 2)


@pytest.mark.slow
def test_crash_and_resume_with_two_processes_follow_the_uninterrupted_trajectory(single, tmp_path):
    """2 processes under `lorapod train --processes 2`, SIGKILLed (launcher, torchrun and ranks)
    after the step-3 checkpoint, resumed with 2 processes: the metrics hold each step once and the
    losses equal the uninterrupted trajectory (the one-process one, which an uninterrupted
    2-process run reproduces: see the loopback test), and only rank 0 wrote."""
    spec_file, reference = single
    run = tmp_path / "crashed"
    proc = _lorapod("train", str(spec_file), "--run-dir", str(run), "--processes", "2", "--device", "cpu",
                    start_new_session=True)
    deadline = time.monotonic() + 240
    try:
        while time.monotonic() < deadline:
            if (run / "checkpoints" / "step-3").is_dir():
                break
            assert proc.poll() is None, proc.stdout.read().decode(errors="replace")[-2000:]
            time.sleep(0.02)
    finally:  # the machine "crashes": every process of the job is SIGKILLed at once
        ranks = psutil.Process(proc.pid).children(recursive=True)
        os.killpg(proc.pid, signal.SIGKILL)
        for r in ranks:
            with contextlib.suppress(psutil.NoSuchProcess):
                r.kill()
        proc.wait()
        psutil.wait_procs(ranks, timeout=15)
    assert not (run / "adapter").exists(), "the run finished before it could be killed"
    _finish(_lorapod("train", "--resume", str(run), "--processes", "2", "--device", "cpu"))
    events = (run / "events.log").read_text().splitlines()
    assert any("resumed from step-" in e for e in events)
    assert len(reference) == 16
    assert _losses(run) == pytest.approx(reference, **TOL)
    assert [r["step"] for r in read_metrics(run / "metrics.jsonl") if "loss" in r] == list(range(1, 17))
    # only rank 0 writes: one line per event and per step, the checkpoints of one writer
    assert sum("finished at step 16" in e for e in events) == 1
    assert sum("checkpoint step-15" in e for e in events) == 1
    # the first start and the resume (the quality autopilot says once per start why it does not score them)
    assert sum("2 processes" in e and "not scored" not in e for e in events) == 2
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step-12", "step-15", "step-3", "step-6", "step-9"]
    state = json.loads((run / "checkpoints" / "step-15" / "state.json").read_text())
    assert state["extra"]["processes"] == 2
    assert (run / "adapter" / "adapter_model.safetensors").is_file()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_two_nodes_on_loopback_with_uneven_windows(assets, tmp_path):
    """Two torchrun launches meet at a c10d rendezvous on 127.0.0.1 (one process each). With
    grad_accum 3 the two processes take 2 and 1 micro-batches, and the epoch's last window has a
    single micro-batch, so node 1 joins with a zero-weighted pass."""
    spec_file = _spec_file(assets, tmp_path, grad_accum=3)
    run = tmp_path / "run"
    rdzv = f"127.0.0.1:{_free_port()}"
    nodes = [_lorapod("train", str(spec_file), "--run-dir", str(run), "--nodes", "2", "--node-rank", str(i),
                      "--rendezvous", rdzv, "--processes", "1", "--device", "cpu") for i in (0, 1)]
    for p in nodes:
        _finish(p)
    single = _one_process(spec_file, tmp_path / "single")
    assert len(single) == 12  # 16 micro-batches per epoch -> 6 steps (the last of 1 micro-batch) x 2
    assert _losses(run) == pytest.approx(single, **TOL)
    assert [r["step"] for r in read_metrics(run / "metrics.jsonl") if "loss" in r] == list(range(1, 13))
    events = (run / "events.log").read_text()
    assert events.count("training ") == 1 and events.count("finished at step 12") == 1


@pytest.mark.slow
def test_two_gpu_shaped_remote_run_over_loopback_ssh(assets, sshd, remote_root, tmp_path):
    """compute.gpus 2 on an ssh:// "instance" (the loopback sshd; CPU, gloo): the job starts under
    torchrun through the job-command seam; metrics, checkpoints, the adapter and teardown as for
    one process."""
    from lorapod.compute.launch import job_command_for
    from lorapod.compute.remote import default_job_command
    from lorapod.compute.session import run_remote
    from lorapod.compute.ssh import SSHProvider
    from lorapod.store.ledger import Ledger

    from .remote_helpers import fast_options

    spec_file = _spec_file(assets, tmp_path, max_steps=6)
    spec = load_spec(spec_file, ["compute.gpus=2"])
    opts = fast_options(identity=sshd.client_key, job_command=job_command_for(2, default_job_command),
                        stop_wait_s=60, ready_deadline_s=60, reconnect_s=60, watchdog={"poll_s": 0.5, "heartbeat_timeout_s": 60, "done_grace_s": 30,
                                                  "stall_s": 300})
    lines: list[str] = []
    summary = run_remote(spec, SSHProvider(sshd.target, identity=sshd.client_key), sshd.target, opts, Ledger(),
                         str(spec_file), say=lines.append)
    assert summary.state == "done", (summary.message, lines[-10:])
    assert any("torch.distributed.run --nproc-per-node 2" in line for line in lines)
    run = summary.run_dir
    assert [r["step"] for r in read_metrics(run / "metrics.jsonl") if "loss" in r] == list(range(1, 7))
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step-3", "step-6"]
    assert (run / "adapter" / "adapter_model.safetensors").is_file()
    assert "2 processes" in (run / "events.log").read_text()
    assert Ledger().instances(live_only=True) == []
    assert list(remote_root.iterdir()) == []


@pytest.mark.slow
def test_two_processes_train_the_tiny_sd_model_like_one(tmp_path):
    """The image recipe through the same loop: 2 processes (micro_batch 1 x grad_accum 2) give the
    one-process losses; samples and exports are rendered once, by rank 0."""
    from lorapod.builtin.sd import build_sd15
    from lorapod.engine.diffusion import train_diffusion

    from .image_fixtures import image_spec, write_images

    raw = image_spec(build_sd15(tmp_path / "sd15"), write_images(tmp_path / "data"), tmp_path / "runs", "sd15",
                     micro_batch_size=1, grad_accum=2, epochs=2)
    raw["samples"] = {"prompts": ["zxq, a red square --w 64 --h 48 --s 2"], "every_epochs": 1}
    spec_file = tmp_path / "spec.yaml"
    spec_file.write_text(yaml.safe_dump(raw))
    one = train_diffusion(load_spec(spec_file), RunDir.create(tmp_path / "one", "sd"), device="cpu",
                          show_progress=False, log=lambda m: None).result.losses
    run = tmp_path / "two"
    _finish(_lorapod("train", str(spec_file), "--run-dir", str(run), "--processes", "2", "--device", "cpu"))
    assert len(one) == 6 and _losses(run) == pytest.approx(one, **TOL)
    assert sorted(p.name for p in (run / "samples").iterdir()) == [
        "epoch001-00.png", "epoch001-grid.png", "epoch002-00.png", "epoch002-grid.png"]
    events = (run / "events.log").read_text()
    assert events.count("samples epoch001") == 1 and events.count("checkpoint step-6") == 1
    assert sorted(p.name for p in (run / "exports").iterdir()) == ["step-3", "step-6"]


@pytest.mark.slow
def test_fsdp_two_processes_follow_one_process_and_resume_exactly(assets, tmp_path):
    """FSDP2 (train.parallel fsdp): the tiny LLM's base sharded over 2 gloo processes. With
    grad_accum 3 the processes take 2 and 1 micro-batches (the other pads with a zero-weighted
    pass, as FSDP needs equal passes; the last window's single micro-batch leaves one with none), and 3 validation batches split 2 + 1. The losses and
    validation losses equal one process's with the same global batch (TOL: rel 1e-5), and a
    resume from the step-3 checkpoint of the 2-process run continues on the same trajectory."""
    _root, model_dir, tr, va = assets
    d = spec_dict(model_dir, tr, va, tmp_path / "runs", epochs=1, grad_accum=3)
    d["method"]["dropout"] = 0.0
    d["eval"]["max_batches"] = 3
    spec_file = tmp_path / "spec.yaml"
    spec_file.write_text(yaml.safe_dump(d))
    single = tmp_path / "single"
    reference = _one_process(spec_file, single)
    run = tmp_path / "fsdp"
    _finish(_lorapod("train", str(spec_file), "--set", "train.parallel=fsdp", "--run-dir", str(run),
                     "--processes", "2", "--device", "cpu"))
    events = (run / "events.log").read_text()
    assert "FSDP2 (train.parallel fsdp): base sharded over 2 processes" in events
    held, whole = (int(x.replace(",", "")) for x in re.search(r"rank 0 holds ([\d,]+) of the ([\d,]+) sharded", events).groups())
    assert whole > 0 and whole / 2 <= held < 0.51 * whole  # half the base (odd dim-0 shards round up on rank 0)
    assert len(reference) == 6 and _losses(run) == pytest.approx(reference, **TOL)
    val = [r["val_loss"] for r in read_metrics(next(single.glob("*/metrics.jsonl"))) if "val_loss" in r]
    assert [r["val_loss"] for r in read_metrics(run / "metrics.jsonl") if "val_loss" in r] == pytest.approx(val, **TOL)
    assert (run / "adapter" / "adapter_model.safetensors").is_file()

    resumed = tmp_path / "resumed"  # the run as it stood at step 3, resumed with 2 FSDP processes
    shutil.copytree(run, resumed, ignore=shutil.ignore_patterns("step-6", "adapter"))
    _finish(_lorapod("train", "--resume", str(resumed), "--processes", "2", "--device", "cpu"))
    assert _losses(resumed) == pytest.approx(reference, **TOL)
    assert "resumed from step-3" in (resumed / "events.log").read_text()


_RANK_SCRIPT = """
import json, os, sys

import safetensors
import safetensors.torch
import torch

opened = []  # every weight file this process opens (transformers reads them with safetensors.safe_open)
_real = safetensors.safe_open


def _spy(path, *args, **kwargs):
    opened.append(str(path))
    return _real(path, *args, **kwargs)


safetensors.safe_open = safetensors.torch.safe_open = _spy  # before transformers imports it

from lorapod.engine import llm
from lorapod.cli.main import main

seen = {}
_shard = llm.LLMRecipe.shard


def shard(self, world):
    seen["devices_before"] = sorted({t.device.type for t in [*self.model.parameters(), *self.model.buffers()]})
    _shard(self, world)
    base = self.model.get_base_model()
    seen["tied"] = base.lm_head.weight is base.model.embed_tokens.weight
    saved = self.model.state_dict().keys()  # persistent=False buffers (rotary inv_freq) are not in it
    seen["buffers"] = {n: b.double().sum().item() for n, b in self.model.named_buffers() if n not in saved}
    # full_tensor gathers every shard: rank 1's base (and its adapter) must be rank 0's, bit for bit
    seen["sums"] = {n: (t.full_tensor() if hasattr(t, "full_tensor") else t).double().sum().item()
                    for n, t in self.model.state_dict().items()}


llm.LLMRecipe.shard = shard
try:
    main(sys.argv[1:])
finally:
    seen["opened"] = opened
    with open(os.path.join(os.environ["SPY_OUT"], f"rank{os.environ['RANK']}.json"), "w") as f:
        json.dump(seen, f)
"""


@pytest.mark.slow
def test_fsdp_only_rank_0_reads_the_base_and_broadcasts_it_into_the_shards(assets, tmp_path):
    """Review G14: with FSDP2 the processes other than rank 0 build the base on ``meta`` and never
    open a weight file (host RAM for one base, not one per process); rank 0 broadcasts the base,
    the adapter and the non-persistent buffers (rotary ``inv_freq``) into their shards. A base with
    tied embeddings stays tied on every process, and the 2-process losses equal one process's."""
    import torch
    from transformers import AutoConfig, AutoTokenizer, LlamaForCausalLM

    _root, model_dir, tr, va = assets
    tied = tmp_path / "tied"
    config = AutoConfig.from_pretrained(model_dir)
    config.tie_word_embeddings = True
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        LlamaForCausalLM(config).save_pretrained(tied)
    AutoTokenizer.from_pretrained(model_dir).save_pretrained(tied)
    d = spec_dict(tied, tr, va, tmp_path / "runs", epochs=1, grad_accum=2, max_steps=3)
    d["method"]["dropout"] = 0.0
    d["train"]["parallel"] = "fsdp"
    spec_file = tmp_path / "spec.yaml"
    spec_file.write_text(yaml.safe_dump(d))
    reference = _one_process(spec_file, tmp_path / "single")

    script, out, run = tmp_path / "rank.py", tmp_path / "spy", tmp_path / "fsdp"
    script.write_text(_RANK_SCRIPT)
    out.mkdir()
    proc = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                             "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{_free_port()}",
                             str(script), "train", str(spec_file), "--run-dir", str(run), "--device", "cpu"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env={**os.environ, "SPY_OUT": str(out)})
    _finish(proc)
    main, other = (json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1))
    weights = [p for p in main["opened"] if p.endswith(".safetensors")]
    assert weights and all(Path(p).parent == tied for p in weights)  # rank 0 read the base
    assert [p for p in other["opened"] if p.endswith(".safetensors")] == []  # rank 1 never did
    assert main["devices_before"] == ["cpu"] and other["devices_before"] == ["meta"]
    assert main["tied"] and other["tied"]
    assert main["buffers"] and other["buffers"] == main["buffers"]
    assert all(v != 0 for v in other["buffers"].values())
    assert other["sums"] == main["sums"] and any("lora_A" in k for k in main["sums"])
    assert len(reference) == 3 and _losses(run) == pytest.approx(reference, **TOL)
