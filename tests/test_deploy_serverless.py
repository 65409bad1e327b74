"""``lorapod deploy RUN --to runpod-serverless``: RunPod's vLLM worker on an endpoint, against a fake
RunPod checked by its OpenAPI document and the loopback Hub; ``ps`` and ``down --endpoint`` know it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lorapod.rundir import RunDir
from lorapod.spec import load_spec

from .cli_helpers import run_cli
from .fakes.hf_hub_fake import FakeHub, Repo
from .fakes.runpod_serverless_fake import RunPodServerlessFake

pytest.importorskip("huggingface_hub")
TOKEN = "hf_" + "y" * 34
GOLDEN = Path(__file__).parent / "golden" / "worker_vllm_args.json"
WORKER_MIRROR = Path("/work/.mirror/runpod-workers+worker-vllm/repo")


@pytest.fixture
def hub(monkeypatch):
    from huggingface_hub import constants

    fake = FakeHub(TOKEN)
    monkeypatch.setenv("HF_ENDPOINT", fake.url)
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)  # tests/conftest.py turns the hub off elsewhere
    yield fake
    fake.close()


@pytest.fixture
def runpod(tmp_path, monkeypatch):
    fake = RunPodServerlessFake(tmp_path)
    monkeypatch.setenv("RUNPOD_API_KEY", fake.account_key)
    monkeypatch.setenv("LORAPOD_RUNPOD_URL", fake.url)
    yield fake
    fake.close()
    assert fake.violations == [], fake.violations


def llm_run(tmp_path: Path, model: str = "meta-llama/Llama-3.2-1B-Instruct", r: int = 16, published=None) -> Path:
    data = tmp_path / "chats.jsonl"
    data.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"},
                                             {"role": "assistant", "content": "hello"}]}) + "\n")
    spec = load_spec(raw={"model": {"id": model, "family": "llm"}, "method": {"r": r},
                          "data": {"path": str(data), "sequence_len": 1024}, "train": {"max_steps": 2},
                          "output": {"dir": str(tmp_path / "runs"), "name": "chat"}})
    run = RunDir.create(spec.output.dir, "chat")
    run.write_spec(spec)
    for row in published or []:  # what `export --to hub` records on this machine
        from lorapod.store.published import remember

        remember(run.root, row)
    return run.root


def adapter_repo(hub: FakeHub, repo_id: str = "me/chat-lora", private: bool = False) -> None:
    hub.repos[repo_id] = Repo(repo_id, private, {"README.md": b"card", "adapter_config.json": b"{}",
                                                 "adapter_model.safetensors": b"x"})


def base_repo(hub: FakeHub, repo_id: str = "meta-llama/Llama-3.2-1B-Instruct", gated: bool | str = "manual") -> None:
    hub.repos[repo_id] = Repo(repo_id, False, {"config.json": b"{}", "model.safetensors": b"x"}, gated=gated)


def test_adapter_on_a_gated_base_needs_a_runpod_secret_then_deploys(hub, runpod, tmp_path, capsys):
    adapter_repo(hub)
    base_repo(hub)
    run = llm_run(tmp_path, published=[{"repo": "me/chat-lora", "what": "adapter"}])
    code, out, err = run_cli(["deploy", str(run), "--to", "runpod-serverless"], capsys)
    assert code != 0 and "is gated" in err and "--hf-secret" in err
    assert runpod.templates == {} and runpod.endpoints == {}  # checked before anything was created

    code, out, err = run_cli(["deploy", str(run), "--to", "runpod-serverless", "--hf-secret", "hf_read"], capsys)
    assert code == 0, err
    (ep,) = runpod.endpoints.values()
    (tpl,) = runpod.templates.values()
    assert tpl["imageName"] == "runpod/worker-v1-vllm:v2.25.2" and tpl["isServerless"]
    env = tpl["env"]
    assert env["MODEL_NAME"] == "meta-llama/Llama-3.2-1B-Instruct" and env["ENABLE_LORA"] == "true"
    assert env["LORA_MODULES"] == "chat-lora=me/chat-lora"  # the form vLLM's --lora-modules parser takes
    assert env["HF_TOKEN"] == "{{ RUNPOD_SECRET_hf_read }}" and TOKEN not in json.dumps(tpl)
    assert ep["workersMin"] == 0 and ep["gpuTypeIds"][0] == "NVIDIA RTX A4000"  # 1B in bf16: the 16 GB class
    url = f"https://api.runpod.ai/v2/{ep['id']}/openai/v1"
    assert url in out and f"curl {url}/chat/completions" in out and '"model": "chat-lora"' in out
    assert "idle with workers_min 0: $0" in out

    code, out, err = run_cli(["ps"], capsys)
    assert code == 0 and f"serverless endpoint {ep['id']}" in out and "$0 idle" in out
    code, out, err = run_cli(["down", "--endpoint", ep["id"]], capsys)
    assert code == 0 and "deleted" in err
    assert runpod.endpoints == {} and runpod.templates == {}  # the template went too
    code, out, err = run_cli(["ps"], capsys)
    assert ep["id"] not in out


def test_workers_min_above_zero_is_refused_without_yes(hub, runpod, tmp_path, capsys):
    adapter_repo(hub)
    base_repo(hub, gated=False)
    run = llm_run(tmp_path, published=[{"repo": "me/chat-lora", "what": "adapter"}])
    code, out, err = run_cli(["deploy", str(run), "--to", "runpod-serverless", "--workers-min", "1"], capsys)
    assert code != 0 and "24/7" in err and "$285.12/month" in err  # 1 x $0.00011/s x 30 days
    assert runpod.templates == {}
    code, out, err = run_cli(["deploy", str(run), "--to", "runpod-serverless", "--workers-min", "1", "--yes"], capsys)
    assert code == 0, err
    assert "$285.12/month always" in out


def test_the_model_must_be_on_the_hub_first(hub, runpod, tmp_path, capsys):
    run = llm_run(tmp_path)
    code, _out, err = run_cli(["deploy", str(run), "--to", "runpod-serverless"], capsys)
    assert code != 0 and "--to hub --repo" in err
    code, _out, err = run_cli(["deploy", str(run), "--to", "runpod-serverless", "--repo", "me/missing"], capsys)
    assert code != 0 and "no repo me/missing" in err
    hub.repos["me/chat-merged"] = Repo("me/chat-merged", False, {"adapter_config.json": b"{}"})
    code, _out, err = run_cli(["deploy", str(run), "--to", "runpod-serverless", "--repo", "me/chat-merged",
                              "--merged"], capsys)
    assert code != 0 and "holds no merged model" in err
    assert runpod.templates == {} and runpod.endpoints == {}


def test_private_merged_repo_and_a_refused_endpoint_leaves_no_template(hub, runpod, tmp_path, capsys):
    from .fakes.base import Fault

    hub.repos["me/chat-merged"] = Repo("me/chat-merged", True, {"config.json": b"{}", "model.safetensors": b"x"})
    run = llm_run(tmp_path, published=[{"repo": "me/chat-merged", "what": "merged"}])
    runpod.faults.append(Fault("POST", "/endpoints", 400, body={"error": "no capacity"}))
    code, out, err = run_cli(["deploy", str(run), "--to", "runpod-serverless", "--merged", "--hf-secret", "hf"], capsys)
    assert code != 0
    assert runpod.templates == {} and runpod.endpoints == {}
    code, out, err = run_cli(["deploy", str(run), "--to", "runpod-serverless", "--merged", "--hf-secret", "hf",
                              "--json"], capsys)
    assert code == 0, err
    got = json.loads(out)
    (tpl,) = runpod.templates.values()
    assert tpl["env"]["MODEL_NAME"] == "me/chat-merged" and "ENABLE_LORA" not in tpl["env"]
    assert got["model"] == "me/chat-merged" and got["url"].endswith("/openai/v1")
    assert [c for c in runpod.calls if c[:2] == ("POST", "/endpoints")] == [("POST", "/endpoints", 400),
                                                                          ("POST", "/endpoints", 200)]


def test_a_hosts_published_json_never_chooses_the_repo_deployed(hub, runpod, tmp_path, capsys):
    """Before: a published.json the instance wrote was pulled home, and `deploy --merged` without
    --repo served `attacker/evil-merged` on the user's account."""
    hub.repos["attacker/evil-merged"] = Repo("attacker/evil-merged", False, {"config.json": b"{}",
                                                                            "model.safetensors": b"x"})
    run = llm_run(tmp_path)
    (run / "published.json").write_text(json.dumps([{"repo": "attacker/evil-merged", "what": "merged"}]))
    code, _out, err = run_cli(["deploy", str(run), "--to", "runpod-serverless", "--merged"], capsys)
    assert code != 0 and "no merged model there" in err and "--repo" in err
    assert runpod.templates == {} and runpod.endpoints == {}


def test_max_model_len_is_bounded_and_checked_against_the_model_before_anything_is_created(hub, runpod, tmp_path,
                                                                                          capsys):
    """Before: `--max-model-len -5` or `10^9` created an endpoint whose worker could not start."""
    adapter_repo(hub)
    base_repo(hub, gated=False)
    run = llm_run(tmp_path, published=[{"repo": "me/chat-lora", "what": "adapter"}])
    deploy = ["deploy", str(run), "--to", "runpod-serverless", "--max-model-len"]
    for bad in ("-5", "0", str(10**9)):
        code, _out, err = run_cli([*deploy, bad], capsys)
        assert code != 0 and f"--max-model-len {bad}" in err and "between 16 and" in err, err
    # Llama 3.2 1B: 16 layers x 8 KV heads x 64 x 2 (K, V) x 2 bytes = 32 KiB a token; 131072 of them is 4.3 GB
    code, _out, err = run_cli([*deploy, "400000"], capsys)
    assert code != 0 and "KV cache" in err, err
    assert runpod.templates == {} and runpod.endpoints == {}
    code, _out, err = run_cli([*deploy, "131072"], capsys)
    assert code == 0, err
    (tpl,) = runpod.templates.values()
    assert tpl["env"]["MAX_MODEL_LEN"] == "131072"


def _ready(hub, tmp_path):
    adapter_repo(hub)
    base_repo(hub, gated=False)
    return llm_run(tmp_path, published=[{"repo": "me/chat-lora", "what": "adapter"}])


def test_a_locked_ledger_stops_the_deploy_before_anything_bills(hub, runpod, tmp_path, capsys, monkeypatch):
    """Before: the ledger row came after the create; with the ledger locked the deploy exited 0 and
    the queued row was dropped at exit: an endpoint billed that no lorapod command knew."""
    import sqlite3

    from lorapod.store.ledger import Ledger

    run = _ready(hub, tmp_path)
    Ledger().close()
    monkeypatch.setenv("LORAPOD_LEDGER_BUSY_S", "0.3")
    holder = sqlite3.connect(Ledger().path, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")  # a backup, a `sqlite3` shell
    try:
        code, _out, err = run_cli(["deploy", str(run), "--to", "runpod-serverless", "--workers-min", "1", "--yes"],
                                  capsys)
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert code != 0 and "could not be recorded" in " ".join(err.split()), err
    assert runpod.templates == {} and runpod.endpoints == {}


def test_a_lost_answer_is_looked_up_by_name_and_ps_shows_the_endpoint(hub, runpod, tmp_path, capsys):
    """RunPod acted on the create but its gateway answered 524: the endpoint is found by the name
    lorapod gave it, recorded, and `ps` (and `ps --json`) show it. Before: "check `lorapod ps`",
    which could not show it."""
    from .fakes.base import Fault

    run = _ready(hub, tmp_path)
    runpod.faults.append(Fault("POST", "/endpoints", 524, body={"error": "A timeout occurred"}, acted=True))
    code, out, err = run_cli(["deploy", str(run), "--to", "runpod-serverless", "--workers-min", "1", "--yes"], capsys)
    assert code == 0, err
    (ep,) = runpod.endpoints.values()
    assert ep["id"] in out and "found endpoint" in " ".join(err.split())
    code, out, _err = run_cli(["ps"], capsys)
    assert f"serverless endpoint {ep['id']}" in out and "$285.12/month always" in out
    code, out, _err = run_cli(["ps", "--json"], capsys)
    (row,) = [r for r in json.loads(out) if r.get("kind") == "endpoint"]
    assert row["instance"] == ep["id"] and row["workers_min"] == 1 and row["state"] == "live"


def test_an_answer_lost_while_runpod_cannot_list_stays_pending_until_down_orphans_settles_it(
        hub, runpod, tmp_path, capsys, monkeypatch):
    import lorapod.deploy.serverless as sl

    from .fakes.base import Fault

    run = _ready(hub, tmp_path)
    runpod.faults += [Fault("POST", "/endpoints", 524, body={"error": "A timeout occurred"}, acted=True),
                      Fault("GET", "/endpoints", 404, body={"error": "not found"})]  # (documented for it)
    code, _out, err = run_cli(["deploy", str(run), "--to", "runpod-serverless"], capsys)
    assert code != 0 and "answer was lost" in err and "lorapod ps" in err
    (ep,) = runpod.endpoints.values()  # it bills: the template is kept (its endpoint uses it)
    code, out, _err = run_cli(["ps"], capsys)
    assert "its create never answered, so it may exist and bill" in out
    code, out, _err = run_cli(["ps", "--json"], capsys)
    (row,) = json.loads(out)
    assert row["kind"] == "endpoint" and row["instance"] is None and row["unconfirmed"]
    runpod.faults.clear()
    monkeypatch.setattr(sl, "SETTLE_S", 0.0)
    code, _out, err = run_cli(["down", "--orphans", "--json"], capsys)
    assert code == 0 and f"exists as {ep['id']}" in " ".join(err.split()), err
    code, out, _err = run_cli(["ps"], capsys)
    assert f"lorapod down --endpoint {ep['id']}" in out
    code, _out, err = run_cli(["down", "--endpoint", ep["id"]], capsys)
    assert code == 0 and runpod.endpoints == {} and runpod.templates == {}


def test_ctrl_c_during_the_create_deletes_what_it_made(hub, runpod, tmp_path, capsys, monkeypatch):
    """Ctrl-C arrives while RunPod makes the endpoint (the create went out, its answer never came
    back to lorapod): it is found by its name and deleted, with its template."""
    from lorapod.compute.runpod.serverless import Serverless

    run = _ready(hub, tmp_path)
    real = Serverless.create_endpoint

    def interrupted(self, body):
        real(self, body)
        raise KeyboardInterrupt

    monkeypatch.setattr(Serverless, "create_endpoint", interrupted)
    code, _out, _err = run_cli(["deploy", str(run), "--to", "runpod-serverless", "--workers-min", "1", "--yes"],
                               capsys)
    assert code != 0
    assert runpod.endpoints == {} and runpod.templates == {}
    code, out, _err = run_cli(["ps", "--json"], capsys)
    assert json.loads(out) == []


def test_ctrl_c_before_runpod_made_it_stays_pending_until_the_sweep_finds_nothing(hub, runpod, tmp_path, capsys,
                                                                                   monkeypatch):
    """Not on RunPod's list right after Ctrl-C may be not listed *yet*: `ps` keeps saying it may
    bill until `down --orphans` asks RunPod again and finds nothing."""
    import lorapod.deploy.serverless as sl
    from lorapod.compute.runpod.serverless import Serverless

    run = _ready(hub, tmp_path)

    def interrupted(self, body):
        raise KeyboardInterrupt

    monkeypatch.setattr(Serverless, "create_endpoint", interrupted)
    code, _out, _err = run_cli(["deploy", str(run), "--to", "runpod-serverless"], capsys)
    assert code != 0 and runpod.endpoints == {} and runpod.templates == {}
    code, out, _err = run_cli(["ps"], capsys)
    assert "may exist and bill" in out
    monkeypatch.setattr(sl, "SETTLE_S", 0.0)
    code, _out, err = run_cli(["down", "--orphans"], capsys)
    assert code == 0 and "was never created" in " ".join(err.split()), err
    code, out, _err = run_cli(["ps", "--json"], capsys)
    assert json.loads(out) == []


def test_ps_on_a_damaged_ledger_lists_endpoints_from_runpod(hub, runpod, tmp_path, capsys):
    from lorapod.store.ledger import Ledger

    run = _ready(hub, tmp_path)
    code, out, err = run_cli(["deploy", str(run), "--to", "runpod-serverless", "--workers-min", "1", "--yes"], capsys)
    assert code == 0, err
    (ep,) = runpod.endpoints.values()
    runpod.endpoints["other"] = {**ep, "id": "other", "name": "someone-elses"}  # not lorapod's: not shown
    ledger = Ledger()
    ledger._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    ledger.close()
    ledger.path.write_bytes(b"this is not a database" * 100)
    code, out, err = run_cli(["ps"], capsys)
    assert "damaged" in err and f"serverless endpoint {ep['id']}" in out and "other" not in out
    code, out, err = run_cli(["ps", "--json"], capsys)
    assert [r["instance"] for r in json.loads(out) if r.get("kind") == "endpoint"] == [ep["id"]]
    # a writing command sets the damaged file aside; the orphan sweep records the endpoint again
    code, _out, err = run_cli(["down", "--orphans"], capsys)
    assert code == 0 and f"endpoint {ep['id']}" in err and "was not in the ledger; recorded" in " ".join(err.split())
    code, out, err = run_cli(["ps"], capsys)
    assert "damaged" not in err and f"lorapod down --endpoint {ep['id']}" in out and "other" not in out
    assert ep["id"] in runpod.endpoints  # found and recorded, never deleted: it was deployed on purpose
    del runpod.endpoints["other"]


def test_a_bogus_endpoint_id_is_refused_before_any_request(runpod, capsys):
    """Before: `down --endpoint ../templates/ID` sent DELETE /templates/ID and recorded the bogus id
    as deleted."""
    from lorapod.store.ledger import Ledger

    runpod.templates["ID"] = {"id": "ID", "name": "mine"}
    for bad in ("../templates/ID", "a?b=1", "x/../y", "-rf"):
        code, _out, err = run_cli(["down", "--endpoint", bad], capsys)
        assert code != 0 and "is not a RunPod endpoint id" in err, err
    assert runpod.calls == [] and "ID" in runpod.templates
    assert not [e for e in Ledger().events() if e["kind"] == "endpoint"]


def test_image_runs_are_refused(hub, runpod, tmp_path, capsys):
    spec = load_spec(raw={"model": {"id": "stabilityai/stable-diffusion-xl-base-1.0", "family": "sdxl"},
                          "data": {"path": str(tmp_path)}, "output": {"dir": str(tmp_path / "runs")}})
    run = RunDir.create(spec.output.dir, "img")
    run.write_spec(spec)
    code, _out, err = run_cli(["deploy", str(run.root), "--to", "runpod-serverless"], capsys)
    assert code != 0 and "vLLM worker serves language models" in err


def test_the_workers_own_arg_builder_reads_lorapods_env(hub, tmp_path):
    """The env lorapod writes is what was recorded from worker-vllm's src/args_builder.py at the
    pinned commit (re-run against a checkout when one is here), and it yields the vLLM flags."""
    from lorapod.deploy.serverless import plan_deployment

    adapter_repo(hub)
    base_repo(hub, gated=False)
    rec = json.loads(GOLDEN.read_text())
    run = llm_run(tmp_path, r=rec["case"]["r"], published=[{"repo": "me/chat-lora", "what": "adapter"}])
    env = plan_deployment(run).template["env"]
    assert env == rec["env"], "lorapod's env changed: re-record tests/golden/worker_vllm_args.json"
    argv = rec["argv"]
    assert argv[argv.index("--model") + 1] == "meta-llama/Llama-3.2-1B-Instruct"
    assert "--enable-lora" in argv and argv[argv.index("--max-lora-rank") + 1] == "32"  # r=24 -> the next vLLM rank
    assert argv[argv.index("--lora-modules") + 1] == "chat-lora=me/chat-lora"
    if WORKER_MIRROR.is_dir():
        import subprocess
        import sys

        src = subprocess.run(["git", "--git-dir", str(WORKER_MIRROR), "show", f"{rec['commit']}:src/args_builder.py"],
                             capture_output=True, text=True, check=True).stdout
        code = src + "\nimport json, sys\nprint(json.dumps(build_vllm_args(json.loads(sys.argv[1]))))\n"
        out = subprocess.run([sys.executable, "-c", code, json.dumps(env)], capture_output=True, text=True, check=True)
        assert json.loads(out.stdout) == argv
