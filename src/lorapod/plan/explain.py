"""What an estimate rests on: its terms, the fitted factors, the published points nearest to
the job, the held-out error of its family, and the user's own runs (``lorapod plan --explain``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from lorapod.catalog.gpus import GPU
from lorapod.catalog.models import ImageModel, LLMArch
from lorapod.plan.estimate import Speed
from lorapod.plan.fit import RANGE_QUANTILE, Residual, fitted, predict_obs, spread
from lorapod.plan.job import Job
from lorapod.plan.measurements import Observation, load_measurements
from lorapod.plan.speed import ELEMENTWISE, attention_arch, dequant_terms, family_of, features, kind_of
from lorapod.plan.vram import Settings
from lorapod.plan.work import QUANTISED

NEAREST = 6


@dataclass(frozen=True)
class Explanation:
    gpu: str
    speed: Speed
    factors: dict[str, float]
    host_us: float  # host time per operator, fitted for the kind
    kernel_min_us: float  # the shortest time a kernel holds the GPU, fitted
    speed_points: list[Residual]
    vram_points: list[Residual]
    speed_range: tuple[float, float]
    vram_range: tuple[float, float]
    vram_parts: dict[str, float]

    def to_json(self) -> dict[str, Any]:
        def point(r: Residual) -> dict[str, Any]:
            o = r.obs
            return {"source": o.source.id, "url": o.source.url, "what": o.what, "metric": o.metric,
                    "published": o.value, "model": round(r.estimate, 4), "read": o.source.read}

        return {
            "gpu": self.gpu,
            "basis": self.speed.basis,
            "seconds_per_step": round(self.speed.seconds_per_step, 4),
            "seconds_per_step_range": [round(self.speed.low, 4), round(self.speed.high, 4)],
            "terms_s": {k: round(v, 5) for k, v in self.speed.terms.items()},
            "efficiency_factors": {k: round(v, 3) for k, v in self.factors.items()},
            "host_us_per_operator": round(self.host_us, 2),
            "kernel_min_us": round(self.kernel_min_us, 2),
            "held_out_range": {"speed": list(self.speed_range), "vram": list(self.vram_range)},
            "speed_points": [point(r) for r in self.speed_points],
            "vram_points": [point(r) for r in self.vram_points],
            "your_runs": [r.__dict__ for r in self.speed.runs],
            "vram_parts_gb": self.vram_parts,
        }


def _similarity(o: Observation, model: ImageModel | LLMArch, gpu: GPU, s: Settings) -> tuple[bool, ...]:
    return (o.model.name == model.name, kind_of(o.model) == kind_of(model), o.gpu_name == gpu.name,
            o.settings.framework == s.framework, o.settings.base_dtype == s.base_dtype)


def nearest(model: ImageModel | LLMArch, gpu: GPU, s: Settings, speed: bool, n: int = NEAREST) -> list[Observation]:
    """The published observations most like this job (same model, kind, GPU, trainer, precision)."""
    pool = [o for o in load_measurements()[1] if o.is_speed == speed and family_of(o.model) == family_of(model)
            and o.metric != "relative_seconds_per_step"]
    pool.sort(key=lambda o: _similarity(o, model, gpu, s), reverse=True)
    return pool[:n]


def explain(job: Job, gpu: GPU, speed: Speed) -> Explanation:
    params = fitted()
    feats = features(job.model, job.settings, gpu)
    factors = {f: params.theta.get(f, 0.0) for f in feats}
    quantised = job.settings.base_dtype in QUANTISED
    memory_bound = (ELEMENTWISE,) if kind_of(job.model) == "llm" else ()  # the only kind whose traffic is timed
    for name in ("attention", attention_arch(feats), *memory_bound,
                 *(dequant_terms(job.settings.base_dtype) if quantised else ())):
        factors[name] = params.theta.get(name, 0.0)
    fam = family_of(job.model)

    def residuals(speed_side: bool) -> list[Residual]:
        return [Residual(o, predict_obs(o, params), held_out=False)
                for o in nearest(job.model, gpu, job.settings, speed_side) if not (speed_side and not o.gpu_name)]

    return Explanation(gpu.name, speed, factors, params.host_us(kind_of(job.model)), params.kernel_min_us(),
                       residuals(True),
                       residuals(False), spread(fam, "speed"), spread(fam, "vram"), job.estimate.parts)


def lines(e: Explanation) -> list[str]:
    """Plain text for the terminal."""
    s = e.speed
    out = [f"Speed on {e.gpu}: {s.seconds_per_step:.3g} s per micro-batch, likely {s.low:.3g}-{s.high:.3g} "
           f"({'from your runs' if s.basis == 'your runs' else 'model'})"]
    for k, v in s.terms.items():
        out.append(f"  {k:<28} {v:8.4f} s")
    out.append("  efficiency factors (fitted, log): " + ", ".join(f"{k} {v:+.2f}" for k, v in e.factors.items())
               + f"; host {e.host_us:.1f} us per operator, a kernel at least {e.kernel_min_us:.1f} us on the GPU")
    out.append(f"  on sources it was not fitted to, {RANGE_QUANTILE:.0%} of this family's published figures "
               f"(each source weighing the same) fell between "
               f"x{e.speed_range[0]:.2f} and x{e.speed_range[1]:.2f} of the estimate: that is the likely range")
    if s.runs:
        out.append("Your runs it rests on:")
        for r in s.runs:
            where = "same GPU" if r.same_gpu else f"on {r.gpu}, carried over by the model's GPU ratio"
            out.append(f"  {r.job_id}: {r.seconds_per_step:.3g} s per step ({where})")
    out.append("Published speed points nearest this job (model fitted on all of them):")
    out.extend(_point_line(r) for r in e.speed_points)
    out.append(f"Published VRAM points nearest this job (held-out range x{e.vram_range[0]:.2f}-x{e.vram_range[1]:.2f}):")
    out.extend(_point_line(r) for r in e.vram_points)
    return out


def _point_line(r: Residual) -> str:
    o = r.obs
    unit = "s a micro-batch" if o.is_speed else "GB"
    label = {"fits_in_gb": "fits in", "max_seconds_per_step": "at most", "max_fit_gb": "longest input fits in"}
    printed = f" (printed: {o.printed})" if o.printed else ""
    return (f"  {o.what}: published {label.get(o.metric, '')} {o.value:.3g} {unit}{printed}, model {r.estimate:.3g} "
            f"({r.error:+.0%}) [{o.source.id}: {o.source.url}]").replace("published  ", "published ")
