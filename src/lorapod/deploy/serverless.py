"""``lorapod deploy runs/JOB --to runpod-serverless``: an OpenAI-compatible endpoint with RunPod's vLLM worker.

The worker is ``runpod/worker-v1-vllm`` (github.com/runpod-workers/worker-vllm, v2.25.2): at start
it turns environment variables into ``vllm serve`` flags (``src/args_builder.py``): ``MODEL_NAME``
-> ``--model``, ``OPENAI_SERVED_MODEL_NAME_OVERRIDE`` -> ``--served-model-name``, ``MAX_MODEL_LEN``,
``ENABLE_LORA`` -> ``--enable-lora``, ``LORA_MODULES`` -> ``--lora-modules`` (verbatim: ``name=path``),
``MAX_LORA_RANK``; ``HF_TOKEN`` for gated or private repos. It serves
``https://api.runpod.ai/v2/<endpoint id>/openai/v1`` with the RunPod API key as the bearer token.

What the worker can reach is a Hugging Face repo, so the model must be on the Hub (``lorapod
export RUN --to hub --repo user/name [--merged]``; this machine remembers it in
``$LORAPOD_HOME/published.jsonl``, never trusting the run folder, which a host writes): either the merged model (``--model`` the repo) or the adapter on its base (``--model`` the
base, the adapter as a vLLM LoRA module). Both are checked on the Hub before anything is created:
the repo holds the files vLLM loads, and a private repo or gated base has a RunPod secret for
``HF_TOKEN`` (``--hf-secret NAME``: the template gets ``{{ RUNPOD_SECRET_NAME }}``, never the
token itself). A network volume is not offered as the source: lorapod cannot look inside one
without renting a pod, so it could not check the model is there.

Cost (catalog/data/serverless.yaml): flex workers bill per second only while they run (a request,
the cold start that loads the model, ``idleTimeout`` after it); with ``workersMin`` 0 an idle
endpoint costs nothing. ``workersMin`` > 0 keeps that many workers running 24/7 at the active
rate, so it is refused without ``--yes``.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import secrets
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from lorapod.errors import LorapodError

WORKER_IMAGE = "runpod/worker-v1-vllm:v2.25.2"
#: the worker's own hub config (.runpod/hub.json "allowedCudaVersions"): its vLLM base image needs CUDA 13
WORKER_CUDA = ["13.0"]
#: vllm/config/lora.py MaxLoRARanks: --max-lora-rank accepts only these
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
GPU_MEMORY_UTILIZATION = 0.9  # vLLM's default share of the GPU it takes
URL = "https://api.runpod.ai/v2/{id}/openai/v1"
_REPO = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}$")
_SECRET = re.compile(r"^[A-Za-z0-9_]{1,64}$")


class DeployError(LorapodError):
    """A deployment refused before anything was created."""


@dataclass(frozen=True)
class GpuClass:
    name: str
    vram_gb: float
    flex: float  # $/s while a worker runs
    active: float  # $/s per workersMin worker, always
    gpu_type_ids: tuple[str, ...]


def gpu_classes() -> list[GpuClass]:
    from lorapod.catalog.snapshot import load_data

    _snap, raw = load_data("serverless")
    return [GpuClass(c["name"], float(c["vram_gb"]), float(c["flex"]), float(c["active"]), tuple(c["gpu_type_ids"]))
            for c in raw["classes"]]


def pick_class(weights_gb: float, gpu: str | None = None) -> GpuClass:
    """The cheapest class whose share of memory vLLM takes holds the weights +25% (KV cache,
    activations, CUDA graphs), or the one that names ``gpu``."""
    classes = gpu_classes()
    if gpu:
        want = re.sub(r"[^a-z0-9]", "", gpu.lower())
        for c in classes:
            if any(want in re.sub(r"[^a-z0-9]", "", g.lower()) for g in c.gpu_type_ids):
                return c
        raise DeployError(f"no RunPod Serverless GPU class has {gpu!r}",
                          hint="one of: " + "; ".join(c.name for c in classes))
    need = weights_gb * 1.25 + 1.0
    fits = [c for c in classes if c.vram_gb * GPU_MEMORY_UTILIZATION >= need]
    if not fits:
        raise DeployError(f"the model needs about {need:.0f} GB to serve; no single-GPU class has that",
                          hint="serve a quantized or smaller model")
    return min(fits, key=lambda c: c.flex)


@dataclass
class Deployment:
    """What will be created, and what it costs; ``template`` and ``endpoint`` are the REST bodies
    (the endpoint's ``templateId`` is filled in once the template exists)."""

    job_id: str
    repo: str
    what: str  # merged | adapter
    model: str  # the name requests use ("model": ...)
    gpu: GpuClass
    workers_min: int
    workers_max: int
    template: dict[str, Any]
    endpoint: dict[str, Any]
    notes: list[str] = field(default_factory=list)

    def costs(self) -> list[str]:
        g = self.gpu
        out = [f"{g.name}: ${g.flex:.5f}/s per running worker (${g.flex * 3600:.2f}/h) while it serves, loads the "
               f"model at a cold start, or waits idleTimeout ({self.endpoint['idleTimeout']} s) after a request"]
        if self.workers_min == 0:
            out.append("idle with workers_min 0: $0 (flex workers scale to zero; the first request after idle waits "
                       "for a cold start)")
        else:
            month = self.workers_min * g.active * 86400 * 30
            out.append(f"workers_min {self.workers_min}: ${month:,.2f}/month always (active rate ${g.active:.5f}/s), "
                       "requests or not")
        out.append(f"container disk {self.template['containerDiskInGb']} GB: about $0.10/GB-month, only while "
                   "workers run")
        return out

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["gpu"] = asdict(self.gpu)
        return d


def published_repo(run_root: Path, merged: bool) -> str | None:
    """The newest ``export --to hub`` of this run of the kind asked for, as this machine recorded
    it (:mod:`lorapod.store.published`); a ``published.json`` in the run folder, which a host may
    have written, is never read."""
    from lorapod.store.published import latest

    return latest(run_root, "merged" if merged else "adapter")


def _hub():
    try:
        from huggingface_hub import HfApi
    except ImportError as exc:
        from lorapod.errors import DependencyError

        raise DependencyError("deploy checks the model on the Hub with huggingface_hub",
                              hint="pip install 'lorapod[export]'") from exc
    return HfApi(endpoint=os.environ.get("HF_ENDPOINT") or None)


def _model_info(api: Any, repo: str, what: str) -> Any:
    from huggingface_hub.errors import HfHubHTTPError

    try:
        return api.model_info(repo)
    except HfHubHTTPError as exc:
        status = exc.response.status_code if exc.response is not None else "?"
        raise DeployError(f"the Hub has no {what} {repo} that this token can see (HTTP {status})",
                          hint="publish it first: lorapod export RUN --to hub --repo " + repo
                          if what != "base model" else "check the base model's id in the spec") from exc


def plan_deployment(run: str | Path, *, repo: str | None = None, merged: bool = False, gpu: str | None = None,
                    workers_min: int = 0, workers_max: int = 1, idle_timeout_s: int = 5,
                    hf_secret: str | None = None, yes: bool = False, max_model_len: int | None = None) -> Deployment:
    """Everything checked, nothing created: the model is a Hub repo the worker can load, the
    token it needs has a RunPod secret, the GPU class holds it, workers_min > 0 is confirmed."""
    from lorapod.rundir import RunDir
    from lorapod.spec import load_spec

    root = Path(run)
    if not (root / "spec.yaml").is_file():
        raise DeployError(f"{root} is not a run folder (no spec.yaml)", hint="lorapod deploy runs/JOB --to runpod-serverless")
    rd = RunDir(root)
    spec = load_spec(rd.spec_file)
    if spec.is_image:
        raise DeployError("RunPod's vLLM worker serves language models, not image LoRAs",
                          hint="load the LoRA in ComfyUI/Forge (lorapod export RUN --to comfyui)")
    if not 0 <= workers_min <= workers_max or not 1 <= workers_max <= 100:
        raise DeployError(f"workers_min {workers_min}, workers_max {workers_max}",
                          hint="0 <= --workers-min <= --workers-max, and --workers-max between 1 and 100")
    if not 1 <= idle_timeout_s <= 3600:
        raise DeployError(f"--idle-timeout {idle_timeout_s}", hint="between 1 and 3600 s (EndpointCreateInput)")
    if hf_secret is not None and not _SECRET.match(hf_secret):
        raise DeployError(f"--hf-secret {hf_secret!r}", hint="the name of a RunPod secret: letters, digits, '_'")
    repo = repo or published_repo(root, merged)
    if repo is None:
        raise DeployError(f"the worker loads the model from the Hugging Face Hub, and this run has no {'merged model' if merged else 'adapter'} there",
                          hint=f"lorapod export {root} --to hub --repo user/name{' --merged' if merged else ''} first, "
                               "or pass --repo")
    if not _REPO.match(repo):
        raise DeployError(f"--repo {repo!r} is not a Hub repo id", hint="user/name")
    api = _hub()
    info = _model_info(api, repo, "repo")
    files = {s.rfilename for s in (info.siblings or [])}
    needs_token = [f"{repo} is private"] if info.private else []
    env: dict[str, str] = {}
    base = spec.model.id
    if merged:
        if "config.json" not in files or not any(f.endswith(".safetensors") for f in files):
            raise DeployError(f"{repo} holds no merged model (config.json + *.safetensors): {', '.join(sorted(files)[:8])}",
                              hint=f"lorapod export {root} --to hub --repo {repo} --merged")
        served = repo
        env.update(MODEL_NAME=repo, OPENAI_SERVED_MODEL_NAME_OVERRIDE=served)
        weights_repo = info
    else:
        if not {"adapter_config.json", "adapter_model.safetensors"} <= files:
            raise DeployError(f"{repo} holds no PEFT adapter (adapter_config.json + adapter_model.safetensors)",
                              hint=f"lorapod export {root} --to hub --repo {repo}, or --merged for a merged model")
        if not _REPO.match(base) or Path(base).exists():
            raise DeployError(f"the base model {base!r} is not a Hub id the worker could download",
                              hint=f"publish the merged model instead: lorapod export {root} --to hub --repo "
                                   f"{repo}-merged --merged, then deploy --merged")
        weights_repo = _model_info(api, base, "base model")
        if getattr(weights_repo, "gated", False):
            needs_token.append(f"the base {base} is gated")
        served = re.sub(r"[^A-Za-z0-9_.-]", "-", repo.split("/")[1])[:64]
        rank = next((r for r in VLLM_LORA_RANKS if r >= spec.method.r), None)
        if rank is None:
            raise DeployError(f"vLLM serves LoRA ranks up to {VLLM_LORA_RANKS[-1]}; this adapter has r={spec.method.r}",
                              hint="deploy --merged")
        # ``name=path``, not the JSON list the worker's docs show: vLLM's LoRAParserAction
        # (entrypoints/openai/cli_args.py) takes each value as name=path or ONE JSON object, and
        # LoRAModulePath(**a_list) is a TypeError it reports as "Invalid fields for --lora-modules"
        env.update(MODEL_NAME=base, ENABLE_LORA="true", MAX_LORA_RANK=str(rank), MAX_LORAS="1",
                   LORA_MODULES=f"{served}={repo}")
    if needs_token:
        if hf_secret is None:
            raise DeployError(" and ".join(needs_token) + ": the worker needs a Hugging Face token",
                              hint="store it as a RunPod secret (console: Secrets) and pass --hf-secret NAME; "
                                   "lorapod never puts the token itself in a template")
        env["HF_TOKEN"] = "{{ RUNPOD_SECRET_" + hf_secret + " }}"
    weights_gb = _weights_gb(spec, weights_repo)
    cls = pick_class(weights_gb, gpu)
    env["MAX_MODEL_LEN"] = str(check_max_model_len(max_model_len, spec, cls, weights_gb))
    job = rd.job_id
    if workers_min > 0 and not yes:
        month = workers_min * cls.active * 86400 * 30
        raise DeployError(f"--workers-min {workers_min} keeps {workers_min} {cls.name} worker(s) running 24/7: about "
                          f"${month:,.2f}/month whether or not anyone calls the endpoint",
                          hint="add --yes to accept that, or use --workers-min 0 (idle costs nothing)")
    suffix = secrets.token_hex(3)
    disk = max(20, int(math.ceil(weights_gb * 1.5 / 10) * 10) + 10)
    template = {"name": f"lorapod-{job}-vllm-{suffix}"[:191], "imageName": WORKER_IMAGE, "isServerless": True,
                "containerDiskInGb": disk, "volumeInGb": 0, "env": env, "category": "NVIDIA"}
    endpoint = {"name": f"lorapod-{job}"[:191], "templateId": "", "gpuTypeIds": list(cls.gpu_type_ids),
                "gpuCount": 1, "workersMin": workers_min, "workersMax": workers_max, "idleTimeout": idle_timeout_s,
                "scalerType": "QUEUE_DELAY", "scalerValue": 4, "executionTimeoutMs": 600000,
                "allowedCudaVersions": WORKER_CUDA, "computeType": "GPU"}
    notes = [f"the model: {what_text(merged, repo, base)}"]
    return Deployment(job, repo, "merged" if merged else "adapter", served, cls, workers_min, workers_max,
                      template, endpoint, notes)


#: The shortest context worth serving, and the longest any model lorapod trains was made for.
MIN_MODEL_LEN = 16
MAX_MODEL_LEN = 1 << 20


def check_max_model_len(asked: int | None, spec: Any, cls: GpuClass, weights_gb: float) -> int:
    """``MAX_MODEL_LEN`` for the worker: the asked length, or the training ``sequence_len`` (at least
    2048). Refused before anything is created when vLLM could not start with it: not a positive
    length within :data:`MAX_MODEL_LEN`, or (for a model the catalog knows) more tokens than the KV
    cache of one sequence can hold in what the GPU class leaves after the weights; vLLM's engine
    refuses such a length at start ("... larger than the maximum number of tokens that can be
    stored in KV cache"), so the worker would restart, and bill, in a loop."""
    n = asked if asked is not None else max(spec.data.sequence_len, 2048)
    if asked is not None and not MIN_MODEL_LEN <= asked <= MAX_MODEL_LEN:
        raise DeployError(f"--max-model-len {asked}", hint=f"a context length between {MIN_MODEL_LEN} and "
                                                            f"{MAX_MODEL_LEN:,} tokens")
    per_token = _kv_bytes_per_token(spec)
    if per_token:
        free = cls.vram_gb * GPU_MEMORY_UTILIZATION * 1e9 - weights_gb * 1e9 * 1.1
        most = int(max(0.0, free) // per_token)
        if n > most:
            raise DeployError(f"a context of {n:,} tokens needs {n * per_token / 1e9:.1f} GB of KV cache; "
                              f"{cls.name} leaves about {max(0.0, free) / 1e9:.1f} GB after the weights "
                              f"(at most {most:,} tokens)",
                              hint="a smaller --max-model-len, or --gpu with more memory")
    return n


def _kv_bytes_per_token(spec: Any) -> int | None:
    """K and V of every layer for one token in bf16, for an LLM the catalog knows; else None."""
    from lorapod.catalog.models import LLMArch, find_model
    from lorapod.errors import PlanError

    try:
        arch = find_model(spec.model.id, "llm")
    except PlanError:
        return None
    if not isinstance(arch, LLMArch):
        return None
    return 2 * arch.layers * arch.kv_heads * arch.head_dim * 2


def what_text(merged: bool, repo: str, base: str) -> str:
    return (f"merged model {repo} from the Hub" if merged
            else f"base {base} + adapter {repo} (a vLLM LoRA module), both from the Hub")


def _weights_gb(spec: Any, info: Any) -> float:
    """The weights to load: the Hub's own safetensors total when it says, else the planner's size."""
    st = getattr(info, "safetensors", None)
    total = getattr(st, "total", None) if st is not None else None
    if isinstance(total, int) and total > 0:
        return total * 2 / 1e9  # parameters in bf16
    from lorapod.errors import PlanError
    from lorapod.plan.job import build_job

    try:
        return float(build_job(spec).download_gb)
    except PlanError:
        return 16.0  # unknown: assume an 8B model in bf16


def curl_example(endpoint_id: str, model: str) -> str:
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": "Hello!"}], "max_tokens": 100})
    return (f"curl {URL.format(id=endpoint_id)}/chat/completions \\\n"
            '  -H "Authorization: Bearer $RUNPOD_API_KEY" -H "Content-Type: application/json" \\\n'
            f"  -d '{body}'")


@dataclass(frozen=True)
class Deployed:
    endpoint_id: str
    template_id: str
    url: str
    model: str
    curl: str


def deploy(dep: Deployment, serverless: Any = None, ledger: Any = None,
           say: Callable[[str], None] = lambda m: None) -> Deployed:
    """Create the template, then the endpoint (each once); a refused endpoint removes the template.

    The endpoint is in the ledger **before** the create call (a pending row with the unique name
    it gets, ``lorapod-<installation>-<key>-<job>``, :func:`lorapod.store.identity.instance_label`'s
    form), as instances are: a ledger that cannot take that row stops the deploy before anything
    exists. When RunPod's answer is lost or Ctrl-C comes during the create, the endpoint is looked
    up by that name: found after a lost answer, it is recorded and the deploy goes on; found after
    Ctrl-C, it is deleted (the user stopped the deploy). Not found (a list may lag a create), or
    RunPod not answering: the pending row stays, so ``lorapod ps`` shows it and ``lorapod down
    --orphans`` settles it from RunPod's own list. A create RunPod refused records that nothing
    exists."""
    from lorapod.compute.runpod.serverless import CreateUncertain, Serverless
    from lorapod.store.identity import instance_label
    from lorapod.store.ledger import Ledger

    sv = serverless or Serverless()
    ledger = ledger or Ledger()
    key = uuid.uuid4().hex[:12]
    name = instance_label("i-" + key, dep.job_id)[:191]
    rec = {"name": name, "model": dep.model, "gpu": dep.gpu.name, "workers_min": dep.workers_min,
           "workers_max": dep.workers_max, "usd_per_s": dep.gpu.flex, "active_usd_per_s": dep.gpu.active,
           "repo": dep.repo, "job": dep.job_id}
    ledger.event_before_create("endpoint", json.dumps({"action": "creating", "key": key, **rec}),
                               f"the pending row of endpoint {name}")  # LedgerBusy: nothing created yet
    try:
        tid = sv.create_template({**dep.template, "name": f"{name[:180]}-vllm"})
    except BaseException as exc:  # a template bills nothing; no endpoint was asked for
        _record(ledger, "create_failed", key=key, why=str(getattr(exc, "message", exc))[:300])
        raise
    try:
        ep = sv.create_endpoint({**dep.endpoint, "name": name, "templateId": tid})
    except BaseException as exc:
        uncertain = isinstance(exc, CreateUncertain | KeyboardInterrupt)
        found, asked = _look_up(sv, name) if uncertain else (None, True)
        if found is not None and not isinstance(exc, KeyboardInterrupt):
            say(f"RunPod's answer to the create was lost; found endpoint {found.id} by its name {name}")
            ep = found
        else:
            if found is not None:  # Ctrl-C: the deploy was stopped, so what it made goes
                with contextlib.suppress(Exception):
                    _record(ledger, "created", key=key, id=found.id, template_id=tid, url=URL.format(id=found.id),
                            **rec)
                    if sv.delete_endpoint(found.id):
                        _record(ledger, "deleted", id=found.id, confirmed=True)
            if asked:
                with contextlib.suppress(Exception):  # the endpoint's error is the one to report
                    sv.delete_template(tid)
                if found is None and not uncertain:  # refused: nothing exists. Not listed after a lost
                    # answer may be not listed *yet*: the row stays pending for `down --orphans`
                    _record(ledger, "create_failed", key=key, why=str(getattr(exc, "message", exc))[:300])
            raise
    url = URL.format(id=ep.id)
    _record(ledger, "created", key=key, id=ep.id, template_id=tid, url=url, **{**rec, "name": ep.name or name})
    if ledger.pending and not ledger.flush(wait_s=5.0):  # locked since the pending row: it stays pending
        say(f"the ledger is locked, so endpoint {ep.id} is recorded as pending only; `lorapod down --orphans` "
            "records it from RunPod's list once the ledger is free")
    return Deployed(ep.id, tid, url, dep.model, curl_example(ep.id, dep.model))


def _record(ledger: Any, action: str, **fields: Any) -> None:
    ledger.event("endpoint", json.dumps({"action": action, **fields}), job_id=None)


def _look_up(sv: Any, name: str) -> tuple[Any, bool]:
    """The endpoint named ``name`` on the account, and whether RunPod could be asked at all."""
    try:
        listed = sv.list_endpoints()
    except (LorapodError, OSError):
        return None, False
    return next((e for e in listed if e.name == name), None), True


def live_endpoints(ledger: Any) -> list[dict[str, Any]]:
    """Endpoints lorapod created, or began to create, and has not seen deleted or refused, from
    the ledger's events; a pending one (its create never answered) has ``id`` None and
    ``state`` ``creating``."""
    out: dict[str, dict[str, Any]] = {}
    for e, rec in ledger.records("endpoint"):
        action, key = rec.get("action"), str(rec.get("key") or rec.get("id"))
        rec.pop("action", None)
        if action == "creating":
            out[key] = {**rec, "id": None, "state": "creating", "since": e["ts"]}
        elif action == "created":
            out[key] = {**out.get(key, {}), **rec, "state": "live"}
        elif action == "create_failed":
            out.pop(key, None)
        elif action == "deleted":
            for k in [k for k, r in out.items() if r.get("id") == rec.get("id")]:
                out.pop(k)
    return list(out.values())


def endpoint_rows(endpoints: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``ps --json`` rows for endpoints: the keys a job's row has, ``kind`` "endpoint"."""
    return [{"kind": "endpoint", "job": ep.get("job"), "state": ep.get("state", "live"), "target": "runpod-serverless",
             "instance": ep.get("id"), "instance_state": ep.get("state", "live"), "gpu": ep.get("gpu"),
             "usd_per_hour": float(ep.get("usd_per_s") or 0) * 3600, "usd": None, "last_step": None,
             "live_instances": 0, "controller_alive": False, "unconfirmed": [] if ep.get("id") else [ep.get("name")],
             "run_dir": None, "summary": endpoint_cost(ep), "setup_s": {}, "name": ep.get("name"),
             "url": ep.get("url"), "model": ep.get("model"), "workers_min": ep.get("workers_min")}
            for ep in endpoints]


def describe_endpoint(ep: dict[str, Any]) -> str:
    """One `ps` line."""
    what = ", ".join(str(v) for v in (ep.get("model"), ep.get("gpu")) if v) or "found by its name"
    if ep.get("id") is None:
        return (f"serverless endpoint {ep.get('name')} ({what}): its create never "
                f"answered, so it may exist and bill ({endpoint_cost(ep)}); `lorapod down --orphans` looks it up "
                "by its name")
    return (f"serverless endpoint {ep['id']} ({what}): {endpoint_cost(ep)}; "
            f"{ep.get('url')}; `lorapod down --endpoint {ep['id']}` removes it")


def labelled_endpoints(say: Callable[[str], None], serverless: Any = None) -> list[dict[str, Any]]:
    """This installation's endpoints as RunPod lists them, by the name lorapod gave them; [] when
    RunPod has no key here or does not answer (said). What ``ps`` shows without a ledger."""
    from lorapod.compute.runpod.serverless import Serverless
    from lorapod.store.identity import installation_id, parse_label

    try:
        sv = serverless or Serverless()
        listed = sv.list_endpoints()
    except LorapodError as exc:
        say(f"runpod-serverless: endpoints not listed ({exc.message})")
        return []
    me = installation_id()
    return [{"id": e.id, "name": e.name, "template_id": e.template_id, "workers_min": e.workers_min,
             "workers_max": e.workers_max, "url": URL.format(id=e.id), "state": "live", "gpu": ", ".join(e.gpu_type_ids[:2]),
             "job": e.name.split("-", 3)[3] if e.name.count("-") >= 3 else None}
            for e in listed if (parse_label(e.name) or ("",))[0] == me]


#: A pending endpoint younger than this may be a deploy still waiting for RunPod's answer.
SETTLE_S = 120.0


def reconcile_endpoints(ledger: Any, say: Callable[[str], None], serverless: Any = None) -> dict[str, int]:
    """``down --orphans``: the ledger's pending endpoints settled from RunPod's own list by name
    (found: recorded with its id; not there: nothing was created), and this installation's
    endpoints the ledger lacks (a damaged ledger restored from a backup, a row a locked ledger
    dropped) recorded, so `ps` and `down --endpoint` know them. Nothing is deleted: an endpoint
    is a service someone deployed on purpose."""
    from lorapod.compute.runpod.serverless import Serverless
    from lorapod.store.identity import installation_id, parse_label

    counts = {"endpoints_found": 0, "endpoints_settled": 0}
    try:
        sv = serverless or Serverless()
        listed = {e.name: e for e in sv.list_endpoints()}
    except LorapodError as exc:
        if any(ep["id"] is None for ep in live_endpoints(ledger)):
            say(f"runpod-serverless: not asked ({exc.message}); pending endpoints were not checked")
        return counts
    known = live_endpoints(ledger)
    ids = {ep["id"] for ep in known if ep["id"]}
    for ep in known:
        if ep["id"] is not None or time.time() - float(ep.get("since") or 0) < SETTLE_S:
            continue  # created, or a deploy may still be waiting for its answer
        found = listed.get(ep.get("name"))
        if found is None:
            _record(ledger, "create_failed", key=ep.get("key"), why="not on RunPod's list: never created")
            say(f"endpoint {ep.get('name')} was never created (RunPod does not list it); ledger updated")
        else:
            _record(ledger, "created", key=ep.get("key"), id=found.id, template_id=found.template_id,
                    url=URL.format(id=found.id), **{k: v for k, v in ep.items()
                                                    if k not in ("id", "state", "key", "template_id", "url", "since")})
            ids.add(found.id)
            say(f"endpoint {ep.get('name')} exists as {found.id}; recorded (`lorapod down --endpoint {found.id}` "
                "removes it)")
        counts["endpoints_settled"] += 1
    me = installation_id()
    for e in listed.values():
        if e.id in ids or (parse_label(e.name) or ("",))[0] != me:
            continue
        _record(ledger, "created", key=e.id, id=e.id, template_id=e.template_id, name=e.name, url=URL.format(id=e.id),
                workers_min=e.workers_min, workers_max=e.workers_max, gpu=", ".join(e.gpu_type_ids[:2]),
                note="found by its name; not in the ledger")
        counts["endpoints_found"] += 1
        say(f"endpoint {e.id} ({e.name}) is lorapod's and was not in the ledger; recorded (`lorapod down "
            f"--endpoint {e.id}` removes it)")
    return counts


def endpoint_cost(rec: dict[str, Any]) -> str:
    n = int(rec.get("workers_min") or 0)
    if n == 0:
        return f"$0 idle (workers_min 0), ${float(rec.get('usd_per_s') or 0) * 3600:.2f}/h per running worker"
    return f"${n * float(rec.get('active_usd_per_s') or 0) * 86400 * 30:,.2f}/month always (workers_min {n})"


def down_endpoint(endpoint_id: str, serverless: Any = None, ledger: Any = None) -> bool:
    """Delete the endpoint, then its template; True when RunPod confirmed the endpoint's delete.
    An id that cannot be RunPod's (``../templates/ID``) is refused before any request."""
    from lorapod.compute.runpod.serverless import Serverless, checked_id
    from lorapod.store.ledger import Ledger

    checked_id(endpoint_id)
    sv = serverless or Serverless()
    ledger = ledger or Ledger()
    known = {r["id"]: r for r in live_endpoints(ledger)}
    gone = sv.delete_endpoint(endpoint_id)
    tid = known.get(endpoint_id, {}).get("template_id")
    if tid:
        sv.delete_template(tid)
    ledger.event("endpoint", json.dumps({"action": "deleted", "id": endpoint_id, "confirmed": gone}), job_id=None)
    return gone
