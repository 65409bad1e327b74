"""Fitting the speed model's efficiency to the published measurements, and honest error bars.

The model's time is the GPU's (physics work divided by fitted efficiencies, memory terms, and a
per-kernel minimum) combined with the host's (operators times a host time per operator, per
kind) (plan/speed.py). Its log efficiency is a sum of terms (kind + GPU architecture + GPU class
+ trainer); fused attention has its own (a base + the GPU architecture), dequantisation of a
4-bit or 8-bit base one more factor, the LLM layers' memory-bound operators one more; all are
fitted by least squares on log time (Gauss-Newton). Every term but the kind's baseline is
pulled towards its prior (ridge: zero for the efficiency terms, measured values for the host's
and the kernel's times), so a combination the data never saw falls back to the kind's baseline
instead of an extrapolation.

Error bars come from leave-one-source-out cross-validation: the model is fitted without one
source and predicts that source's points, for every source. The spread of those held-out errors
per family (LLM, image, video) and metric (speed, VRAM) is the likely range printed with every
estimate. The memory model has no fitted part, so its errors are held-out errors as they stand.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

from lorapod.fsutil import atomic_write_text
from lorapod.home import lorapod_home
from lorapod.plan.frameworks import framework
from lorapod.plan.measurements import Observation, load_measurements
from lorapod.plan.speed import (
    ATTENTION_PRIOR,
    ELEMENTWISE,
    KERNEL_MIN,
    OVERLAP_P,
    PCIE_GB_S,
    Params,
    attention_arch,
    dequant_terms,
    family_of,
    features,
    fp8_peak_factor,
    kind_of,
    predict,
)
from lorapod.plan.vram import estimate
from lorapod.plan.work import step_work

RIDGE = 0.5
# Host time per operator (Python, the dispatcher, autograd's bookkeeping and the launch), pulled
# towards this (microseconds), more weakly than the efficiency terms. The prior is eager PyTorch's
# measured per-operator overhead on the order of 10-20 us (docs/planner.md gives the measurements).
HOST_PRIOR_US = 15.0
HOST_RIDGE = 0.2
# The shortest time a kernel holds the GPU (launch to completion of an empty kernel, a few us on
# every CUDA GPU measured; docs/planner.md), pulled there firmly: it is a hardware constant.
KERNEL_MIN_PRIOR_US = 3.0
KERNEL_MIN_RIDGE = 2.0
# Dequantisation's factor starts at the memory bandwidth (1x) and is pulled there weakly.
DEQUANT_RIDGE = 0.1
ITERATIONS = 40
# The likely range: this quantile of the family's held-out errors (in log space, both ways).
RANGE_QUANTILE = 0.9
# A family with too few held-out points borrows the spread of all points.
MIN_POINTS_FOR_SPREAD = 5


@dataclass(frozen=True)
class Residual:
    """One held-out comparison: the model's estimate next to the published figure."""

    obs: Observation
    estimate: float
    held_out: bool = True

    @property
    def ratio(self) -> float:
        return self.estimate / self.obs.value

    @property
    def error(self) -> float:
        return self.ratio - 1

    @property
    def family(self) -> str:
        return family_of(self.obs.model)

    @property
    def metric(self) -> str:
        return "speed" if self.obs.is_speed else "vram"

    @property
    def ok(self) -> bool:
        """Within target: speed 20%, VRAM 25%; a bound holds when the estimate is under it."""
        if self.obs.is_bound:
            return self.estimate <= self.obs.value
        return abs(self.error) <= (0.20 if self.metric == "speed" else 0.25)


def model_family(model: Any) -> str:
    """The accuracy group issue 26's targets are set for: a diffusion family's ``speed_group`` in the
    catalog (SD/SDXL, FLUX, Wan, ...) or LLM (the printed ranges use family_of's llm / image / video)."""
    from lorapod.catalog.families import FAMILIES

    row = FAMILIES.get(getattr(model, "family", "llm"))
    return row.speed_group if row is not None else "LLM"


def speed_points(obs: Sequence[Observation] | None = None) -> list[Observation]:
    """Observations the speed model can be fitted to: a measured step on a known GPU."""
    pool = obs if obs is not None else load_measurements()[1]
    return [o for o in pool if o.metric == "seconds_per_step" and o.gpu_name]


def ratio_pairs(obs: Sequence[Observation] | None = None) -> list[tuple[Observation, Observation]]:
    """Pairs (a, b) of one source's relative step times for the same job on two GPUs: the fit uses
    time(a) / time(b), which tells GPUs apart even when the source's level is not to be trusted."""
    pool = obs if obs is not None else load_measurements()[1]
    groups: dict[tuple[str, str, Any], list[Observation]] = {}
    for o in pool:
        if o.metric == "relative_seconds_per_step" and o.gpu_name:
            groups.setdefault((o.source.id, o.model.name, o.settings), []).append(o)
    pairs = []
    for group in groups.values():
        group.sort(key=lambda o: o.gpu_name)
        pairs += [(a, group[0]) for a in group[1:]]
    return pairs


def _ratio_obs(a: Observation, b: Observation) -> Observation:
    return replace(a, metric="speed_ratio", value=a.value / b.value, what=f"{a.what} / {b.gpu_name}, time ratio")


@dataclass(frozen=True)
class _Row:
    """One speed point reduced to what the fit needs: work terms (mean over its buckets) and features."""

    feats: list[str]
    host: str
    matmul_s: float  # seconds at efficiency 1
    attention_s: float
    aux_s: float
    launches: float  # kernel launches
    dequant: tuple[str, ...]
    dequant_s: float  # dequantisation at the memory bandwidth
    fixed_s: float  # memory terms (no fitted part)
    swap_s: float
    measured: float
    elementwise_s: float = 0.0  # memory-bound operators at the bandwidth (LLM layers; counted, plan/work.py)


def _row(o: Observation) -> _Row:
    gpu = o.gpu()
    vs = o.settings.variants()
    acc = np.zeros(8)
    for v in vs:
        w = step_work(o.model, v)
        acc += np.array([w.matmul_tflops / fp8_peak_factor(v, gpu), w.attention_tflops, w.aux_tflops, w.kernels,
                         w.dequant_gb / gpu.mem_bw_gbs,
                         (w.stream_gb + w.optimizer_gb) / gpu.mem_bw_gbs, w.swap_gb / PCIE_GB_S,
                         w.elementwise_gb / gpu.mem_bw_gbs])
    acc /= len(vs)
    if not framework(o.settings.framework).prefetches_blocks:  # transfers add to the step (plan/speed.py)
        acc[5], acc[6] = acc[5] + acc[6], 0.0
    peak = gpu.bf16_tflops
    return _Row(features(o.model, o.settings, gpu), f"host:{kind_of(o.model)}", acc[0] / peak, acc[1] / peak,
                acc[2] / peak, acc[3], tuple(dequant_terms(o.settings.base_dtype)), acc[4], acc[5], acc[6], o.value,
                acc[7])


def _names(rows: list[_Row]) -> list[str]:
    ew = {ELEMENTWISE} if any(r.elementwise_s for r in rows) else set()
    return sorted(ew | {f for r in rows for f in r.feats} | {"attention", KERNEL_MIN} | {r.host for r in rows}
                  | {attention_arch(r.feats) for r in rows}
                  | {n for r in rows if r.dequant_s > 0 for n in r.dequant})


def _prior(name: str) -> tuple[float, float]:
    """(prior value, ridge weight) of a parameter."""
    if name.startswith("host:"):
        return math.log(HOST_PRIOR_US), HOST_RIDGE
    if name == KERNEL_MIN:
        return math.log(KERNEL_MIN_PRIOR_US), KERNEL_MIN_RIDGE
    if name.startswith("dequant:") or name == ELEMENTWISE:
        return 0.0, DEQUANT_RIDGE
    if name.startswith("kind:"):
        return math.log(0.3), 1e-3
    if name == "attention":
        return ATTENTION_PRIOR, 1e-3
    return 0.0, RIDGE


def _model_and_grad(r: _Row, th: dict[str, float], idx: dict[str, int]) -> tuple[float, np.ndarray]:
    """log predicted seconds and its gradient by the parameters (plan/speed.py's model: the GPU's
    time and the host's, combined as a p-norm)."""
    log_e = sum(th[f] for f in r.feats)
    mm = (r.matmul_s + r.aux_s) * math.exp(-log_e)
    aa = attention_arch(r.feats)
    att = r.attention_s * math.exp(-(th["attention"] + th[aa]))
    kmin = r.launches * math.exp(th[KERNEL_MIN]) * 1e-6
    dq = r.dequant_s * math.exp(sum(th[n] for n in r.dequant)) if r.dequant_s else 0.0
    ew = r.elementwise_s * math.exp(th[ELEMENTWISE]) if r.elementwise_s else 0.0
    device = mm + att + kmin + dq + r.fixed_s + ew
    host = r.launches * math.exp(th[r.host]) * 1e-6
    core = (device**OVERLAP_P + host**OVERLAP_P) ** (1 / OVERLAP_P)
    g = np.zeros(len(idx))
    if r.swap_s > core:  # transfer-bound: nothing fitted moves it
        return math.log(r.swap_s), g
    # d log(core) = (device^(P-1) d device + host^(P-1) d host) / core^P
    wd = device ** (OVERLAP_P - 1) / core**OVERLAP_P
    wh = host ** (OVERLAP_P - 1) / core**OVERLAP_P
    for f in r.feats:
        g[idx[f]] -= mm * wd
    g[idx["attention"]] -= att * wd
    g[idx[aa]] -= att * wd
    g[idx[KERNEL_MIN]] += kmin * wd
    g[idx[r.host]] += host * wh
    if dq:
        for n in r.dequant:
            g[idx[n]] += dq * wd
    if ew:
        g[idx[ELEMENTWISE]] += ew * wd
    return math.log(core), g


def fit(points: Sequence[Observation], pairs: Sequence[tuple[Observation, Observation]] = ()) -> Params:
    """Fit the efficiency terms, attention's factor and launch latencies to speed observations
    (and time ratios between GPUs): least squares on log time (Gauss-Newton), each term pulled
    towards its prior (ridge)."""
    assert points, "no speed points to fit"
    rows = [_row(o) for o in points]
    prows = [(_row(a), _row(b)) for a, b in pairs]
    names = _names(rows + [r for p in prows for r in p])
    # The ratios only inform what the measured steps cannot (a GPU no step was measured on):
    # they must not move the terms the steps already pin down.
    only_ratios = np.array([0.0 if n in set(_names(rows)) else 1.0 for n in names])
    idx = {n: i for i, n in enumerate(names)}
    prior = np.array([_prior(n)[0] for n in names])
    weight = np.array([_prior(n)[1] for n in names])
    x = prior.copy()
    y = np.log([r.measured for r in rows] + [a.measured / b.measured for a, b in prows])
    for _ in range(ITERATIONS):
        th = dict(zip(names, x, strict=True))
        out = [_model_and_grad(r, th, idx) for r in rows]
        for a, b in prows:
            (pa, ga), (pb, gb) = _model_and_grad(a, th, idx), _model_and_grad(b, th, idx)
            out.append((pa - pb, (ga - gb) * only_ratios))
        pred, jac = zip(*out, strict=True)
        j = np.array(jac)
        lhs = j.T @ j + np.diag(weight) + 1e-6 * np.eye(len(names))
        rhs = j.T @ (np.array(pred) - y) + weight * (x - prior)
        step = np.clip(np.linalg.solve(lhs, rhs), -1.0, 1.0)
        x = x - step
        if np.max(np.abs(step)) < 1e-6:
            break
    return Params(dict(zip(names, (float(v) for v in x), strict=True)))


def fitted() -> Params:
    """The speed model fitted to every published point (what ``lorapod plan`` uses)."""
    return Params(dict(_calibration()["theta"]))


def predict_obs(o: Observation, params: Params) -> float:
    """The model's figure for an observation, in the observation's unit."""
    if o.is_speed:
        return predict(o.model, o.settings, o.gpu(), params)[0]
    return estimate(o.model, o.settings).read_as(o.source.peak_reads)


def peak_share(o: Observation) -> float:
    """The share of the GPU's paper bf16 peak a published step time implies for the work the model
    counts (plan/work.py's FLOPs). Above 1 the stated settings cannot be what ran; near it they are
    doubtful (docs/planner.md lists such points). 0 for observations that are not step times."""
    if o.metric != "seconds_per_step" or not o.gpu_name:
        return 0.0
    vs = o.settings.variants()
    tflops = sum(step_work(o.model, v).tflops for v in vs) / len(vs)
    return tflops / (o.gpu().bf16_tflops * o.value)


def held_out(obs: Sequence[Observation] | None = None, exclude: frozenset[str] = frozenset()) -> list[Residual]:
    """Leave-one-source-out: every observation predicted by a model fitted without its source.

    ``exclude`` drops whole sources first (nested cross-validation of the ranges uses it).
    """
    pool = [o for o in (obs if obs is not None else load_measurements()[1]) if o.source.id not in exclude]
    train, pairs = speed_points(pool), ratio_pairs(pool)
    out = []
    cache_: dict[str, Params] = {}

    def params(sid: str) -> Params:
        if sid not in cache_:
            rest = [p for p in train if p.source.id != sid]
            cache_[sid] = fit(rest, [p for p in pairs if p[0].source.id != sid]) if rest else fit(train, pairs)
        return cache_[sid]

    for o in pool:
        if (o.is_speed and not o.gpu_name) or o.metric == "relative_seconds_per_step":
            continue
        out.append(Residual(o, predict_obs(o, params(o.source.id))))
    for a, b in pairs:
        p = params(a.source.id)
        ratio = predict(a.model, a.settings, a.gpu(), p)[0] / predict(b.model, b.settings, b.gpu(), p)[0]
        out.append(Residual(_ratio_obs(a, b), ratio))
    return out


def quantile_spread(residuals: Sequence[Residual]) -> tuple[float, float]:
    """(low, high) multipliers of an estimate that held-out figures fell between.

    Symmetric in log space: the RANGE_QUANTILE of |log(published / estimate)|, each source
    weighing the same however many points it has (one big table must not set everyone's range).
    """
    errs = [(abs(math.log(r.obs.value / r.estimate)), r.obs.source.id) for r in residuals if not r.obs.is_bound]
    if not errs:
        return 0.7, 1.4
    count: dict[str, int] = {}
    for _, sid in errs:
        count[sid] = count.get(sid, 0) + 1
    errs.sort()
    total = len(count)
    acc = 0.0
    q = errs[-1][0]
    for e, sid in errs:
        acc += 1 / count[sid] / total
        if acc >= RANGE_QUANTILE:
            q = e
            break
    return math.exp(-q), math.exp(q)


def spread_from(residuals: Sequence[Residual], family: str, metric: str) -> tuple[float, float]:
    """Ranges are for step times and peaks: GPU time ratios (reported apart) do not widen them."""
    usable = [r for r in residuals if r.metric == metric and not r.obs.is_bound and r.obs.metric != "speed_ratio"]
    same = [r for r in usable if r.family == family]
    if len(same) < MIN_POINTS_FOR_SPREAD:
        same = usable
    return quantile_spread(same)


def spread(family: str, metric: str) -> tuple[float, float]:
    """The likely-range multipliers printed with an estimate of this family and metric."""
    lo, hi = _calibration()["spreads"][f"{family}/{metric}"]
    return lo, hi


def measured_archs() -> frozenset[str]:
    """GPU architectures with at least one measured step (not only ratios) in the dataset."""
    return frozenset(_calibration()["archs"])


def unseen_arch_spread() -> tuple[float, float]:
    """The range for a GPU architecture no step was measured on: the held-out error of the GPU
    ratios (the model's guess for an architecture it was not fitted to), at least the usual one."""
    lo, hi = _calibration()["unseen"]
    return lo, hi


def _calibrate() -> dict[str, Any]:
    """Everything a plan needs from the published points: the fitted terms, the likely-range
    multipliers per family and metric (leave-one-source-out), the range for an unseen GPU
    architecture, and the architectures with a measured step."""
    points, pairs = speed_points(), ratio_pairs()
    residuals = held_out()
    ratios = [r for r in residuals if r.obs.metric == "speed_ratio"]
    return {
        "theta": fit(points, pairs).theta,
        "spreads": {f"{fam}/{metric}": spread_from(residuals, fam, metric)
                    for fam in ("llm", "image", "video") for metric in ("speed", "vram")},
        "unseen": quantile_spread(ratios) if ratios else (0.5, 2.0),
        "archs": sorted({o.gpu().arch for o in points}),
    }


# What the calibration is computed from: the catalog's data and the model's code. A change to any
# of them makes a new cache key, so a stale calibration is never read.
_CALIBRATION_INPUTS = ("catalog/data/measurements.yaml", "catalog/data/models.yaml", "catalog/data/gpus.yaml",
                       "plan/measurements.py", "catalog/models.py", "catalog/gpus.py", "plan/fit.py",
                       "plan/speed.py", "plan/work.py", "plan/vram.py", "plan/frameworks.py")


def _calibration_key() -> str:
    root = Path(__file__).resolve().parents[1]
    h = hashlib.sha256()
    for rel in _CALIBRATION_INPUTS:
        h.update(rel.encode() + b"\0" + (root / rel).read_bytes() + b"\0")
    return h.hexdigest()[:24]


@cache
def _calibration() -> dict[str, Any]:
    """The calibration, from ``$LORAPOD_HOME/cache/`` when its inputs are unchanged.

    Fitting takes about a second and the leave-one-source-out ranges about a second more, on
    every ``lorapod plan``; both depend only on files that change with a lorapod upgrade. A cache
    that cannot be read or written is recomputed (and the plan goes on without it)."""
    path = lorapod_home() / "cache" / f"planner-calibration-{_calibration_key()}.json"
    try:
        cal = json.loads(path.read_text())
        if {"theta", "spreads", "unseen", "archs"} <= cal.keys():
            return cal
    except (OSError, ValueError, AttributeError):
        pass
    cal = _calibrate()
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, json.dumps(cal, sort_keys=True))
    return cal


def range_holds(residuals_by_source: dict[str, list[Residual]]) -> list[tuple[Residual, bool]]:
    """Nested check of the ranges: each source's range comes from the other sources' errors only."""
    out = []
    for sid, mine in residuals_by_source.items():
        others = [r for s, rs in residuals_by_source.items() if s != sid for r in rs]
        for r in mine:
            if r.obs.is_bound or r.obs.metric == "speed_ratio":
                continue
            lo, hi = spread_from(others, r.family, r.metric)
            out.append((r, r.estimate * lo <= r.obs.value <= r.estimate * hi))
    return out
