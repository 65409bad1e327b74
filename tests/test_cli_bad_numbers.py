"""Every number a user can pass is finite and bounded, every id length-checked, and what is said
about money is true (issue 46, item 4), through the CLI: each case here used to wait forever while
an instance billed, read a NaN or an infinity as "no ceiling", end in a traceback, or call a loss a
saving. Nothing here rents anything: each is refused first."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from lorapod.store.ledger import Ledger
from lorapod.store.preemptions import record_preemption, record_spot_instance

from .remote_helpers import cli_argv, cli_env, make_spec

REPO = Path(__file__).resolve().parents[1]
SDXL = REPO / "examples" / "sdxl-object-lora.yaml"


def cli(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    out = subprocess.run([*cli_argv(), *args], capture_output=True, text=True, env=env or cli_env(), timeout=timeout,
                         cwd=REPO)
    out.stderr = " ".join(out.stderr.split())  # the console wraps long lines
    return out


def refused(out: subprocess.CompletedProcess[str], *words: str) -> None:
    assert out.returncode in (1, 2), (out.returncode, out.stdout[-2000:], out.stderr[-2000:])  # 2: a SpecError
    assert "Traceback" not in out.stderr and "Error:" not in out.stderr.split("error:")[0], out.stderr[-2000:]
    for w in words:
        assert w in out.stderr, out.stderr[-2000:]


@pytest.mark.parametrize("value", ["nan", "1e308", "-1"])
def test_run_refuses_a_preempt_confirm_wait_that_is_not_a_finite_bounded_number(runpod, tmp_path, value):
    """``--preempt-confirm-s nan`` (or 1e308) once waited forever on a crashed spot job while it billed."""
    env = cli_env(RUNPOD_API_KEY=runpod.account_key, LORAPOD_RUNPOD_URL=runpod.url,
                  LORAPOD_RUNPOD_GRAPHQL_URL=runpod.graphql_url)
    out = cli("run", str(make_spec(tmp_path)), "--on", "runpod", "--spot", "always", "--preempt-confirm-s", value,
              env=env)
    refused(out, "preempt-confirm-s", "finite number")
    assert runpod.instances == {} and Ledger().instances() == []  # refused before anything was rented


@pytest.mark.parametrize("args", [("--max-usd", "inf"), ("--max-hours", "nan"), ("--usd-per-hour", "-3")])
def test_run_refuses_caps_and_prices_that_are_not_finite(tmp_path, args):
    refused(cli("run", str(make_spec(tmp_path)), "--on", "local", *args), args[0], "finite number")
    assert Ledger().instances() == []


def test_doctor_refuses_a_bid_ceiling_that_is_not_a_number(runpod):
    """``doctor --spot --max-bid nan`` once read as no ceiling and printed an offer to rent."""
    env = cli_env(RUNPOD_API_KEY=runpod.account_key, LORAPOD_RUNPOD_URL=runpod.url,
                  LORAPOD_RUNPOD_GRAPHQL_URL=runpod.graphql_url)
    refused(cli("doctor", "runpod", "--spot", "--max-bid", "nan", env=env), "--max-bid", "finite number")
    refused(cli("doctor", "runpod", "--spot", "--max-bid", "1e308", env=env), "--max-bid")


@pytest.mark.parametrize("key,value", [("max_bid_per_gpu_hour", ".inf"), ("max_bid_per_gpu_hour", ".nan"),
                                       ("spot_checkpoint_min", "1e-300"), ("max_usd", ".inf")])
def test_a_spec_number_that_is_not_finite_and_bounded_is_a_spec_error(tmp_path, key, value):
    """``compute.max_bid_per_gpu_hour: .inf`` was taken as no ceiling; ``spot_checkpoint_min: 1e-300``
    was an OverflowError traceback from the planner."""
    spec = yaml.safe_load(SDXL.read_text())
    spec["data"]["path"] = str(REPO / "examples" / spec["data"]["path"])
    spec["compute"].update(spot="auto", **{key: yaml.safe_load(value)})
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    refused(cli("plan", str(path)), key)


@pytest.mark.parametrize("command", [("stop",), ("logs", "-f"), ("down",), ("pull",)])
def test_an_id_of_100000_characters_is_refused_not_a_traceback(command):
    refused(cli(*command, "x" * 100_000), "100000 characters", "is not a")


def test_ps_never_calls_a_loss_a_saving(tmp_path):
    """A spot job whose instances cost more than on-demand would have (a bid above the on-demand
    price, preemptions redone): ``ps`` and ``logs`` say how much more, never "saved $-0.0123"."""
    ledger = Ledger()
    job = "spotty-20261205-101500-ab12"
    ledger.job_started(job, str(tmp_path / "runs" / job), "runpod", "runpod", None, 1.0, None)
    record_spot_instance(ledger, job, provider="runpod", gpu="RTX 3090", tier="spot", hours=1.0, preempted=True,
                         usd_per_hour=0.40, ondemand_usd_per_hour=0.22)
    record_preemption(ledger, job, instance_id="i-1", how="stopped", step=10, resume_step=8, usd_per_hour=0.40,
                      redo_hours=0.1, setup_hours=0.1, husk_hours=0.0, ondemand_usd_per_hour=0.22)
    ledger.job_ended(job, "stopped", "stopped at step 10")
    ledger.flush()
    ps = subprocess.run([*cli_argv(), "ps"], capture_output=True, text=True, env=cli_env(COLUMNS="200"), timeout=60)
    text = " ".join(ps.stdout.split())
    assert ps.returncode == 0, ps.stderr
    assert "saved $-" not in text and "MORE than on-demand" in text, text
