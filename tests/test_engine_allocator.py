"""The CUDA caching allocator's setting and what an out-of-memory error says about it (review N9):
expandable segments unless the user chose otherwise, set before CUDA's allocator starts, by the
engine and by the instance's job wrapper; the OOM message names memory reserved but unallocated."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch
import yaml

from lorapod.compute.remote import JOB_SH
from lorapod.engine import loop
from lorapod.engine.device import ALLOC_CONF, default_alloc_conf
from lorapod.engine.loop import out_of_memory
from lorapod.spec import load_spec

REPO = Path(__file__).resolve().parents[1]
READ = "import os; print(os.environ.get('PYTORCH_CUDA_ALLOC_CONF'), os.environ.get('PYTORCH_ALLOC_CONF'))"


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")}


def _engine_sees(env: dict[str, str]) -> str:
    """What a fresh interpreter's environment holds once the engine picked its device."""
    code = f"from lorapod.engine.device import pick_device\npick_device('cpu')\n{READ}"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**_clean_env(), "PYTHONPATH": str(REPO / "src"), **env})
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.strip()


def test_the_engine_sets_expandable_segments_unless_the_user_chose():
    assert _engine_sees({}) == f"{ALLOC_CONF} None"
    assert _engine_sees({"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:512"}) == "max_split_size_mb:512 None"
    # torch >= 2.9's own name, read first by torch: lorapod adds nothing beside it
    assert _engine_sees({"PYTORCH_ALLOC_CONF": "garbage_collection_threshold:0.6"}) == \
        "None garbage_collection_threshold:0.6"
    env: dict[str, str] = {}
    assert default_alloc_conf(env) == ALLOC_CONF and default_alloc_conf(env) is None


def _job_sh_sees(folder: Path, secrets: str | None = None) -> str:
    folder.mkdir()
    (folder / "job.sh").write_text(JOB_SH)
    if secrets is not None:
        (folder / "secrets.env").write_text(secrets)
    subprocess.run(["bash", "job.sh", sys.executable, "-c", READ], cwd=folder, timeout=120, check=True,
                   env={**_clean_env(), "LORAPOD_JOBS_DIR": str(folder / "jobs")})
    assert (folder / "job.exit").read_text().strip() == "0"
    return (folder / "job.log").read_text().strip()


def test_the_instance_job_wrapper_sets_it_too_unless_forwarded(tmp_path):
    """job.sh runs every remote job (torchrun's N processes and external trainers included); a
    setting the user forwards (--forward-env, in secrets.env) is kept."""
    assert _job_sh_sees(tmp_path / "a") == f"{ALLOC_CONF} None"
    assert _job_sh_sees(tmp_path / "b", "PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync\n") == \
        "backend:cudaMallocAsync None"


def test_the_oom_message_says_what_the_allocator_held_beyond_the_tensors(tmp_path, monkeypatch):
    (tmp_path / "d.jsonl").write_text("")
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump({"model": {"id": "Qwen/Qwen2.5-7B", "family": "llm"},
                                    "data": {"path": str(tmp_path / "d.jsonl"), "sequence_len": 4096},
                                    "train": {"micro_batch_size": 4, "gradient_checkpointing": False},
                                    "output": {"dir": str(tmp_path / "runs")}}))
    monkeypatch.setattr(loop, "device_memory_gb", lambda device: 23.6)
    err = out_of_memory(load_spec(path), tmp_path / "run", torch.device("cuda", 0), 41,
                        tmp_path / "run/checkpoints/step-41", 20.1, reserved_gb=23.4)
    assert ("(peak 20.10 GiB allocated, 23.40 GiB reserved by the caching allocator (3.30 GiB of it held but "
            "unallocated); the plan estimated") in err.message
