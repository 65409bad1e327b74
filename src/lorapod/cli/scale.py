"""Start ``lorapod train`` as N data-parallel processes (and on several nodes) under torchrun.

The command a user types (``lorapod train SPEC --processes 2``) prepares the run folder, then
hands over to ``torch.distributed.run``, which starts the same command N times with ``RANK`` /
``WORLD_SIZE`` set; those processes train (see :mod:`lorapod.engine.distributed`).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from lorapod.engine.distributed import torchrun_argv
from lorapod.errors import LorapodError, SpecError
from lorapod.rundir import RunDir


def child_argv(run: RunDir, spec_file: Path | None, resume: bool, set_: list[str], device: str | None) -> list[str]:
    """``lorapod train`` arguments for each process: always the prepared run folder."""
    argv = ["train", "--resume", str(run.root)] if resume else ["train", str(spec_file), "--run-dir", str(run.root)]
    for s in set_:
        argv += ["--set", s]
    if device:
        argv += ["--device", device]
    return argv


def launch_processes(run: RunDir, spec_file: Path | None, resume: bool, set_: list[str], device: str | None,
                     nproc: int, nodes: int = 1, node_rank: int = 0, rendezvous: str | None = None) -> None:
    """Run the training processes under torchrun and wait for them; a failure is one error."""
    if nodes > 1 and not rendezvous:
        raise SpecError(f"--nodes {nodes} needs --rendezvous HOST:PORT (node 0's address, the same on every node)",
                        hint="e.g. --rendezvous 10.0.0.1:29400, and --node-rank 0..N-1 on each machine")
    if not 0 <= node_rank < nodes:
        raise SpecError(f"--node-rank {node_rank} is not between 0 and {nodes - 1}")
    argv = torchrun_argv(nproc, child_argv(run, spec_file, resume, set_, device), nnodes=nodes,
                         node_rank=node_rank if nodes > 1 else None, rdzv_endpoint=rendezvous,
                         rdzv_id=run.job_id)
    rc = subprocess.run(argv, check=False).returncode
    if rc != 0:
        raise LorapodError(f"the training processes failed (torchrun exit {rc})",
                           hint=f"see the messages above and {run.events_file}; continue with "
                                f"`lorapod train --resume {run.root} --processes {nproc}`")
