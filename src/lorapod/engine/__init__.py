"""The built-in trainer: one recipe per family (llm.py, diffusion) over shared pieces
(loop, checkpoint, metrics, progress, optim, device).

:func:`train` is the one entry: ``lorapod train`` (and every process torchrun starts for it)
calls it with a spec and a run folder, and it hands the job to the family's recipe.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from lorapod.errors import LorapodError

if TYPE_CHECKING:
    from lorapod.rundir import RunDir
    from lorapod.spec import JobSpec


def train(spec: JobSpec, run: RunDir, *, resume: bool = False, device: str | None = None,
          log: Callable[[str], None] = print) -> Any:
    """Train ``spec`` into ``run`` with the recipe of its model family (images and video:
    :mod:`lorapod.engine.diffusion`; LLMs: :mod:`lorapod.engine.llm`); ``resume`` continues from
    the run folder's newest checkpoint. Returns the loop's result (``first_eval``, ``last_eval``,
    ``stopped``, ``state``). The image engine's packages are imported only for an image spec."""
    if spec.is_image:
        try:
            from lorapod.engine.diffusion import train_diffusion
        except ImportError as exc:  # the image engine ships with lorapod[image]
            raise LorapodError(f"the image engine is not available: {exc}", hint="pip install 'lorapod[image]'") from exc
        return train_diffusion(spec, run, resume=resume, device=device, log=log).result
    from lorapod.engine.llm import train_llm

    return train_llm(spec, run, resume=resume, device=device, log=log).result
