"""``lorapod deploy RUN --to runpod-serverless``: an OpenAI-compatible endpoint for a trained LLM
(lorapod.deploy.serverless); ``lorapod down --endpoint ID`` removes it, ``lorapod ps`` lists it."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.console import Console

console = Console(highlight=False)
err = Console(stderr=True, highlight=False)


def register(app: typer.Typer) -> None:
    @app.command("deploy")
    def deploy(
        run: Path = typer.Argument(..., help="The run folder (runs/JOB)."),
        to: str = typer.Option(..., "--to", help="runpod-serverless"),
        repo: str | None = typer.Option(None, "--repo", help="The Hub repo to serve (default: the run's last "
                                        "`export --to hub` of that kind)."),
        merged: bool = typer.Option(False, "--merged", help="Serve the merged model (else base + adapter)."),
        gpu: str | None = typer.Option(None, "--gpu", help="A GPU in the class to use, e.g. 'RTX 4090' "
                                       "(default: the cheapest class that holds the model)."),
        workers_min: int = typer.Option(0, "--workers-min", help="Workers kept running 24/7 (billed always; "
                                        "needs --yes above 0)."),
        workers_max: int = typer.Option(1, "--workers-max", help="At most this many workers at once."),
        idle_timeout: int = typer.Option(5, "--idle-timeout", help="Seconds a worker waits for the next request "
                                         "(billed) before scaling down."),
        hf_secret: str | None = typer.Option(None, "--hf-secret", help="RunPod secret holding HF_TOKEN, for a "
                                             "private repo or a gated base."),
        max_model_len: int | None = typer.Option(None, "--max-model-len", help="Context length vLLM reserves "
                                                 "(default: the training sequence_len, at least 2048)."),
        yes: bool = typer.Option(False, "--yes", help="Accept --workers-min above 0 (it bills 24/7)."),
        as_json: bool = typer.Option(False, "--json", help="JSON on stdout."),
    ) -> None:
        """Serve a trained LLM on RunPod Serverless with RunPod's vLLM worker (OpenAI-compatible)."""
        from lorapod.deploy.serverless import DeployError, plan_deployment
        from lorapod.deploy.serverless import deploy as create

        if to != "runpod-serverless":
            raise DeployError(f"--to {to!r}", hint="runpod-serverless (the only target so far)")
        dep = plan_deployment(run, repo=repo, merged=merged, gpu=gpu, workers_min=workers_min,
                              workers_max=workers_max, idle_timeout_s=idle_timeout, hf_secret=hf_secret, yes=yes,
                              max_model_len=max_model_len)
        for n in dep.notes:
            err.print(n, markup=False)
        done = create(dep, say=lambda m: err.print(m, markup=False))
        if as_json:
            typer.echo(json.dumps({"endpoint_id": done.endpoint_id, "template_id": done.template_id, "url": done.url,
                                   "model": done.model, "costs": dep.costs(), "curl": done.curl}))
            return
        console.print(f"endpoint {done.endpoint_id}: {done.url}", markup=False)
        console.print(f"model name in requests: {done.model}", markup=False)
        for c in dep.costs():
            console.print(f"cost: {c}", markup=False)
        console.print("try it (the first request waits for a cold start: the worker downloads and loads the model):",
                      markup=False)
        console.print(done.curl, markup=False, soft_wrap=True)
        console.print(f"remove it: lorapod down --endpoint {done.endpoint_id}", markup=False)
