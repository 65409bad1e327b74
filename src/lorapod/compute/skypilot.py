"""SkyPilot as a backend (``lorapod run SPEC --on sky``), for clusters and clouds lorapod has no
provider of its own for (Kubernetes, AWS, GCP, Azure, Lambda, ...).

Built on SkyPilot's Python API, an optional extra (``pip install 'lorapod[sky]'``):

- one ``sky.Task`` per job: ``workdir`` is a staged folder (the spec with relative paths, the
  data, a wheel of this very lorapod), ``setup`` installs the wheel into the image's Python
  (the stock-image bootstrap), ``run`` starts ``lorapod train`` under torchrun with SkyPilot's
  node list (``SKYPILOT_NODE_IPS``, ``SKYPILOT_NODE_RANK``, ``SKYPILOT_NUM_GPUS_PER_NODE``), so
  ``compute.nodes`` machines x ``compute.gpus`` GPUs train one data-parallel job;
- ``sky.Resources`` from the planner's choice of GPU (or ``--gpu``), ``compute.gpus`` of them per
  node, ``compute.cloud`` when set, on-demand, the spec's disk;
- launched with ``down=True`` and an idle autostop: SkyPilot tears the cluster down after the job,
  whatever happens to this process (the role lorapod's on-instance watchdog plays elsewhere).

No cloud is reachable from the machine these tests run on, so only the building of tasks and
resources is tested (against SkyPilot's own constructors and YAML schema); see docs/remote.md.
"""

from __future__ import annotations

import shlex
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lorapod.errors import LorapodError, PlanError
from lorapod.spec import JobSpec

if TYPE_CHECKING:
    from lorapod.rundir import RunDir

INSTALL_HINT = "pip install 'lorapod[sky]' (SkyPilot), then `sky check` to see which clouds it can use"
RDZV_PORT = 29500
#: Idle minutes after which SkyPilot downs the cluster if nothing else did.
AUTODOWN_IDLE_MIN = 10

#: lorapod's GPU names (catalog/gpus) -> SkyPilot's accelerator names (``sky show-gpus``).
#: A GPU missing here is refused by name rather than guessed.
SKY_ACCELERATORS: dict[str, str] = {
    "RTX 3090": "RTX3090",
    "RTX 4090": "RTX4090",
    "RTX 5090": "RTX5090",
    "RTX A6000": "RTXA6000",
    "A40": "A40",
    "L4": "L4",
    "L40S": "L40S",
    "A100 40GB": "A100",
    "A100 80GB": "A100-80GB",
    "H100 SXM": "H100",
    "H200": "H200",
}


def require_sky() -> Any:
    try:
        import sky
    except ImportError as exc:
        raise LorapodError(f"the SkyPilot backend needs the skypilot package ({exc})", hint=INSTALL_HINT) from exc
    return sky


def sky_accelerator(gpu: str) -> str:
    from lorapod.catalog.gpus import find_gpu

    name = find_gpu(gpu).name
    if name not in SKY_ACCELERATORS:
        raise PlanError(f"lorapod does not know SkyPilot's name for {name}",
                        hint=f"pin one it knows with --gpu: {', '.join(SKY_ACCELERATORS)}")
    return SKY_ACCELERATORS[name]


def choose_gpu(spec: JobSpec, gpu: str | None = None) -> str:
    """The pinned GPU, else the planner's cheapest fitting one that SkyPilot has a name for."""
    if gpu or spec.compute.gpu:
        return gpu or spec.compute.gpu  # type: ignore[return-value]
    from lorapod.compute.provider import load_facts
    from lorapod.plan.choose import plan_job

    load_facts()
    plan = plan_job(spec)
    for option in plan.options:
        if option.fits and option.gpu in SKY_ACCELERATORS:
            return option.gpu
    raise PlanError("the planner found no GPU that fits this job and that SkyPilot can rent",
                    hint="pin one with --gpu, or make the job smaller (`lorapod plan` shows why)")


def setup_script(wheel: str, extra: str | None) -> str:
    """Install the staged wheel (and its dependencies) into the image's Python."""
    target = f"./{wheel}[{extra}]" if extra else f"./{wheel}"  # ./ : a path to pip, not a name
    return f"set -e\npython3 -m pip install -q {shlex.quote(target)}\n"


def run_script(gpus_per_node: int, job_id: str, spec: str = "spec.yaml", run_dir: str = "run") -> str:
    """``lorapod train`` under torchrun on every node, rendezvous at the first node of SkyPilot's list."""
    train = shlex.join(["-m", "lorapod", "train", spec, "--run-dir", run_dir])
    return (
        "set -e\n"
        'HEAD=$(echo "$SKYPILOT_NODE_IPS" | head -n1)\n'
        'NNODES=$(echo "$SKYPILOT_NODE_IPS" | wc -l)\n'
        "python3 -m torch.distributed.run"
        f' --nnodes "$NNODES" --nproc-per-node "${{SKYPILOT_NUM_GPUS_PER_NODE:-{gpus_per_node}}}"'
        ' --node-rank "$SKYPILOT_NODE_RANK" --rdzv-backend c10d'
        f' --rdzv-endpoint "$HEAD:{RDZV_PORT}" --rdzv-id {shlex.quote(job_id)} {train}\n'
    )


def build_resources(spec: JobSpec, gpu: str) -> Any:
    sky = require_sky()
    kwargs: dict[str, Any] = {"accelerators": {sky_accelerator(gpu): spec.compute.gpus},
                              "disk_size": int(spec.compute.disk_gb), "use_spot": False}
    if spec.compute.cloud:
        kwargs["infra"] = spec.compute.cloud
    return sky.Resources(**kwargs)


def build_task(spec: JobSpec, job_id: str, workdir: Path, wheel: str, gpu: str,
               extra: str | None = None) -> Any:
    """One ``sky.Task`` for the job (workdir staged by :func:`stage`)."""
    sky = require_sky()
    task = sky.Task(name=f"lorapod-{job_id}"[:60], workdir=str(workdir), setup=setup_script(wheel, extra),
                    run=run_script(spec.compute.gpus, job_id), num_nodes=spec.compute.nodes,
                    envs={"PYTHONUNBUFFERED": "1"})
    task.set_resources(build_resources(spec, gpu))
    return task


def stage(spec: JobSpec, workdir: Path, wheel: Path) -> JobSpec:
    """Copy the data (and a local base model or prompts file) and the wheel into ``workdir``;
    write spec.yaml pointing at the copies, relative to the workdir SkyPilot syncs to each node."""
    workdir.mkdir(parents=True, exist_ok=True)

    def put(path: str, idx: int) -> str:
        src = Path(path)
        if not src.exists():
            raise LorapodError(f"{src} does not exist", hint="fix data.path in the spec")
        dest = workdir / "data" / f"{idx}-{src.name}"
        dest.parent.mkdir(parents=True, exist_ok=True)
        (shutil.copytree if src.is_dir() else shutil.copy2)(src, dest)
        return str(dest.relative_to(workdir))

    out = spec.relocated(put)
    shutil.copy2(wheel, workdir / wheel.name)
    (workdir / "spec.yaml").write_text(out.to_yaml(), encoding="utf-8")
    return out


def launch(task: Any, cluster: str) -> tuple[int | None, Any]:
    """Start the task on a new cluster that SkyPilot downs after the job (and when idle)."""
    sky = require_sky()
    request = sky.launch(task, cluster_name=cluster, down=True, idle_minutes_to_autostop=AUTODOWN_IDLE_MIN)
    return sky.stream_and_get(request)


def down(cluster: str) -> None:
    sky = require_sky()
    sky.stream_and_get(sky.down(cluster))


def cluster_name(job_id: str) -> str:
    """SkyPilot cluster names are lowercase letters, digits and dashes, starting with a letter."""
    import re

    return ("lorapod-" + re.sub(r"[^a-z0-9-]+", "-", job_id.lower())).strip("-")[:60]


def run_on_sky(spec: JobSpec, gpu: str | None = None, dry_run: bool = False,
               say: Callable[[str], None] = print) -> RunDir:
    """Stage, build the task, launch it, follow its log, pull the run folder, down the cluster.

    With ``dry_run`` only the task is built and written to ``<run>/sky-task.yaml``.
    """
    import subprocess

    import yaml

    from lorapod.compute.remote import build_wheel
    from lorapod.fsutil import atomic_write_text
    from lorapod.home import lorapod_home
    from lorapod.rundir import RunDir

    require_sky()
    run = RunDir.create(spec.output.dir, spec.output.name or "job")
    run.write_spec(spec)
    gpu_name = choose_gpu(spec, gpu)
    workdir = lorapod_home() / "sky" / run.job_id
    wheel = build_wheel(lorapod_home() / "wheels")
    staged = stage(spec, workdir, wheel)
    task = build_task(staged, run.job_id, workdir, wheel.name, gpu_name, extra="image" if spec.is_image else "llm")
    atomic_write_text(run.root / "sky-task.yaml", yaml.safe_dump(task.to_yaml_config(), sort_keys=False))
    say(f"SkyPilot task: {spec.compute.nodes} node(s) x {spec.compute.gpus} {gpu_name}"
        + (f" on {spec.compute.cloud}" if spec.compute.cloud else "") + f"; {run.root / 'sky-task.yaml'}")
    if dry_run:
        return run
    cluster = cluster_name(run.job_id)
    run.event(f"sky launch {cluster}")
    try:
        sky_job, _handle = launch(task, cluster)
        require_sky().tail_logs(cluster, sky_job, follow=True)
        # SkyPilot writes an SSH alias for the cluster's head node; the run folder is there
        subprocess.run(["rsync", "-a", "--exclude", ".tmp-*", f"{cluster}:sky_workdir/run/", f"{run.root}/"],
                       check=True, timeout=3600)
        run.event("pulled the run folder from the head node")
    finally:
        down(cluster)
        run.event(f"sky down {cluster}")
    return run
