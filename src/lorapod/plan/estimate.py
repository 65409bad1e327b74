"""The planner's estimate of one micro-batch step: the speed model with its fitted parameters,
its likely range, the user's own runs when one matches, and a card that spills.

Kept apart from the physics (plan/speed.py) so the model, its fit (plan/fit.py) and the user's
runs (plan/learned.py) each import only the model and never each other: this module is the one
place that puts them together. Every estimate carries a likely range: the spread of the model's
errors on sources it was not fitted to (leave-one-source-out), for its family (LLM, image,
video), widened for a GPU architecture no published step was measured on.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from lorapod.catalog.gpus import GPU
from lorapod.catalog.models import ImageModel, LLMArch
from lorapod.plan.fit import fitted, measured_archs, spread, unseen_arch_spread
from lorapod.plan.learned import Match, measured_step
from lorapod.plan.speed import efficiencies, family_of, features, predict
from lorapod.plan.vram import Estimate, Settings

# A card that runs out of VRAM and spills into shared system memory (Windows drivers) drops to
# 50+ s per step (kohya_ss issue #1288, quoted by the guide). On Linux hosts it is an OOM.
SPILL_SECONDS_PER_STEP = 50.0


@dataclass(frozen=True)
class Speed:
    seconds_per_step: float
    tokens_per_step: int = 0
    spill: bool = False
    efficiency: float = 0.0
    low: float = 0.0  # likely range of seconds per step
    high: float = 0.0
    basis: str = "model"  # model | your runs
    terms: dict[str, float] = field(default_factory=dict)
    runs: tuple[Match, ...] = ()

    @property
    def it_per_s(self) -> float:
        return 1.0 / self.seconds_per_step

    @property
    def tokens_per_s(self) -> float:
        return self.tokens_per_step / self.seconds_per_step if self.tokens_per_step else 0.0


def matmul_rate(model: ImageModel | LLMArch, s: Settings, gpu: GPU) -> float:
    """TFLOPs per second the GPU sustains on this model's matmuls: paper peak x fitted efficiency.
    Work that is neither measured nor modelled term by term (the cache phase's VAE and text
    encoders) is scaled between GPUs by this rate."""
    return gpu.bf16_tflops * efficiencies(features(model, s, gpu), fitted())[0]


def step_speed(model: ImageModel | LLMArch, s: Settings, gpu: GPU, est: Estimate | None = None,
               *, learn: bool = True, spec_settings: Settings | None = None) -> Speed:
    """The planner's estimate of one micro-batch step, from the user's own runs when one matches.

    ``s`` is what an average micro-batch computes (an unpacked LLM job's rows padded to their
    batch's longest, plan/padding.py); ``spec_settings`` the spec's own settings, which the user's
    runs are recorded and matched by (default: ``s``)."""
    params = fitted()
    seconds, parts, eff = predict(model, s, gpu, params)
    lo, hi = spread(family_of(model), "speed")
    if gpu.arch not in measured_archs():  # e.g. Hopper, Blackwell: no published step of their own
        ulo, uhi = unseen_arch_spread()
        lo, hi = min(lo, ulo), max(hi, uhi)
    tokens = s.batch * s.seq_len if isinstance(model, LLMArch) else 0
    speed = Speed(seconds, tokens, False, eff, seconds * lo, seconds * hi, "model", parts)
    if learn:
        got = measured_step(model, spec_settings or s, gpu, params, (speed.high - speed.low) / 2 / speed.seconds_per_step)
        if got is not None:
            mine, half, runs = got
            speed = Speed(mine, tokens, False, eff, mine * (1 - half), mine * (1 + half), "your runs", parts, runs)
    spill = est is not None and est.verdict(gpu) == "does-not-fit"
    if spill:
        slow = max(speed.seconds_per_step, SPILL_SECONDS_PER_STEP)
        speed = Speed(slow, tokens, True, eff, slow, max(slow, speed.high), speed.basis, parts, speed.runs)
    return speed
