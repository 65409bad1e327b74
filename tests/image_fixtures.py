"""What the image tests share beside the tiny pipelines (those are built by ``lorapod.builtin.sd``):
a spec for them, the engine on CPU, and a crash to raise from a step hook."""

from __future__ import annotations

from pathlib import Path

from lorapod.demo_image import write_images

__all__ = ["image_spec", "write_images"]


def image_spec(model_dir: Path, data: Path, out: Path, family: str, **train) -> dict:
    t = {"epochs": 2, "micro_batch_size": 2, "grad_accum": 1, "learning_rate": 5e-3, "seed": 0,
         "scheduler": "constant", "precision": "fp32"}
    t.update(train)
    return {
        "model": {"id": str(model_dir), "family": family},
        "method": {"r": 4, "alpha": 8, "dropout": 0.0},
        "data": {"path": str(data), "format": "images", "resolution": 64, "trigger": "zxq"},
        "train": t,
        "eval": {"max_batches": 1},
        "save": {"every_epochs": 1, "keep_last": 10},
        "output": {"dir": str(out), "name": "t"},
    }


def train_cpu(spec, run, tmp_path, **kw):
    """lorapod's diffusion engine on CPU, quietly, with its latent cache under ``tmp_path``."""
    from lorapod.engine.diffusion import train_diffusion

    return train_diffusion(spec, run, device="cpu", show_progress=False, log=lambda m: None,
                           cache_root=tmp_path / "cache", **kw)


class Crash(Exception):
    """Raised from a step hook to stand for a machine that dies mid-run."""
