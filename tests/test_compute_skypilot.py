"""The SkyPilot backend: the tasks and resources lorapod builds, checked by SkyPilot itself.

No cloud is reachable here, so nothing is launched; the run script is executed with SkyPilot's
node variables and a stand-in ``python3``, and torchrun's own parser reads what it would start.
"""

from __future__ import annotations

import os
import subprocess

import pytest

from lorapod.compute.skypilot import build_task, cluster_name, sky_accelerator, stage
from lorapod.errors import PlanError
from lorapod.spec import load_spec

from .remote_helpers import make_spec

sky = pytest.importorskip("sky", reason="SkyPilot is an optional extra: pip install 'lorapod[sky]'")


@pytest.mark.slow
def test_task_and_resources_pass_skypilot_validation(tmp_path):
    from sky.utils import common_utils, schemas
    from torch.distributed.run import get_args_parser

    spec = load_spec(make_spec(tmp_path), ["compute.gpus=4", "compute.nodes=2", "compute.cloud=aws",
                                           "compute.disk_gb=200"])
    wheel = tmp_path / "lorapod-0.1.0-py3-none-any.whl"
    wheel.write_bytes(b"PK")
    workdir = tmp_path / "work"
    staged = stage(spec, workdir, wheel)
    assert staged.data.path == "data/0-train.jsonl" and (workdir / staged.data.path).is_file()
    assert load_spec(workdir / "spec.yaml").data.path == str(workdir / "data/0-train.jsonl")

    task = build_task(staged, "demo-20261201-000000-ab12", workdir, wheel.name, "A100 80GB", extra="llm")
    cfg = task.to_yaml_config()
    common_utils.validate_schema(cfg, schemas.get_task_schema(), "Invalid task YAML: ")
    again = sky.Task.from_yaml_config(cfg)
    (res,) = again.resources
    assert again.num_nodes == 2 and res.accelerators == {"A100-80GB": 4}
    assert str(res.cloud).lower() == "aws" and res.disk_size == 200 and not res.use_spot
    assert "python3 -m pip install -q './lorapod-0.1.0-py3-none-any.whl[llm]'" in task.setup

    # the run script, on node 1 of 2, starts exactly this torchrun
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").write_text('#!/bin/sh\nprintf "%s\\n" "$@" > "$ARGS_OUT"\n')
    (bin_dir / "python3").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "ARGS_OUT": str(tmp_path / "args"),
           "SKYPILOT_NODE_IPS": "10.0.0.7\n10.0.0.8", "SKYPILOT_NODE_RANK": "1", "SKYPILOT_NUM_GPUS_PER_NODE": "4"}
    subprocess.run(["bash", "-c", task.run], env=env, check=True, cwd=tmp_path)
    argv = (tmp_path / "args").read_text().splitlines()
    assert argv[:2] == ["-m", "torch.distributed.run"]
    args = get_args_parser().parse_args(argv[2:])
    assert (args.nnodes, args.nproc_per_node, args.node_rank, args.rdzv_backend, args.rdzv_endpoint) == \
        ("2", "4", 1, "c10d", "10.0.0.7:29500")
    assert args.module and args.training_script == "lorapod"
    assert args.training_script_args == ["train", "spec.yaml", "--run-dir", "run"]


def test_names_skypilot_does_not_know_are_refused():
    assert sky_accelerator("4090") == "RTX4090" and sky_accelerator("h100") == "H100"
    with pytest.raises(PlanError, match="H100 PCIe"):
        sky_accelerator("H100 PCIe")
    assert cluster_name("My_Job.v2-20261201") == "lorapod-my-job-v2-20261201"


