"""Sweeps: the grid, the shared dollar cap, the ranking, over two loopback SSH hosts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lorapod.compute.ssh import SSHProvider
from lorapod.compute.sweep import Sweep, expand_grid
from lorapod.errors import SpecError
from lorapod.spec import load_spec
from lorapod.store.ledger import Ledger

from .fake_trainer import fake_val_loss
from .remote_helpers import fake_command, fast_options, make_spec

RATE = 36.0  # $/h on both hosts: a cent a second, so the cap is reached in seconds


def test_grid_is_the_cartesian_product_in_order():
    assert expand_grid(["train.learning_rate=1e-4,2e-4", "method.r=8,16"]) == [
        {"train.learning_rate": "1e-4", "method.r": "8"}, {"train.learning_rate": "1e-4", "method.r": "16"},
        {"train.learning_rate": "2e-4", "method.r": "8"}, {"train.learning_rate": "2e-4", "method.r": "16"}]
    for bad in (["lr"], ["train.learning_rate="], ["a=1", "a=2"]):
        with pytest.raises(SpecError):
            expand_grid(bad)


@pytest.mark.slow
def test_four_jobs_two_hosts_total_cap_stops_it_midway(sshd_factory, remote_root, tmp_path):
    hosts = [sshd_factory(), sshd_factory()]
    hosts[1].authorize(Path(f"{hosts[0].client_key}.pub").read_text())  # one --identity for both, as on the CLI
    spec = load_spec(make_spec(tmp_path, every=4))
    cap = 0.40
    margin = 4.0  # seconds of budget kept for the orderly stop (checkpoint, pull, destroy)
    targets = [(h.target, SSHProvider(h.target, identity=h.client_key, usd_per_hour=RATE)) for h in hosts]
    # The short jobs (8 steps) finish; the long ones (2000 steps) are stopped by their share of the cap.
    seen_running: list[list[str]] = []  # sweep.json's job ids when a job ends mid-sweep (what `lorapod ui` groups)

    def say(msg: str) -> None:
        if msg.startswith("[") and (" done: $" in msg or " stopped: $" in msg):
            got = json.loads((sweep.root / "sweep.json").read_text()) if (sweep.root / "sweep.json").is_file() else {}
            seen_running.append([j["job_id"] for j in got.get("ranked", []) if j.get("job_id")])

    sweep = Sweep(spec, ["train.max_steps=8,2000", "train.learning_rate=1e-4,3e-4"], targets, parallel=2,
                  max_usd=cap, say=say,
                  options=lambda: fast_options(job_command=fake_command(0.05, ("--eval",)), stop_margin_s=margin,
                                               identity=hosts[0].client_key))
    result = sweep.run()
    by_index = {j.index: j for j in result.jobs}
    assert [by_index[i].state for i in (1, 2, 3, 4)] == ["done", "done", "stopped", "stopped"], \
        [(j.index, j.state, j.message) for j in result.jobs]
    assert {j.target for j in result.jobs} == {h.target for h in hosts}
    assert "max-usd cap" in by_index[3].message
    # the cap holds across the jobs, from the ledger's own accounting
    ledger = Ledger()
    assert sum(ledger.usd(j.job_id) for j in result.jobs) <= cap
    assert all(ledger.usd(j.job_id) <= j.allotted_usd for j in result.jobs)  # each within its share
    # nothing left alive: no instance in the ledger, no work folder, no process on the hosts
    assert ledger.instances(live_only=True) == []
    assert list(remote_root.iterdir()) == []
    # ranked by the last val_loss each job logged (recomputed here from the trainer's formula)
    assert all(j.loss_key == "val_loss" and j.loss is not None for j in result.jobs)
    expected = sorted(result.jobs, key=lambda j: j.loss)
    assert [j.index for j in result.ranked] == [j.index for j in expected]
    lr_of = {1: 1e-4, 2: 3e-4, 3: 1e-4, 4: 3e-4}
    assert by_index[1].loss == fake_val_loss(lr_of[1], 8) and by_index[2].loss == fake_val_loss(lr_of[2], 8)
    # the winner is the best-ranked job that finished with an adapter, copied into the sweep folder
    assert result.winner is by_index[2]
    assert (result.winner_adapter / "adapter_model.safetensors").read_bytes() == \
        (Path(by_index[2].run_dir) / "adapter" / "adapter_model.safetensors").read_bytes()
    assert (result.root / "sweep.json").is_file()
    assert seen_running and all(len(ids) >= 2 for ids in seen_running), seen_running  # written while it ran


@pytest.mark.slow
def test_cli_sweep_on_local_prints_ranked_json(tmp_path, monkeypatch):
    import json
    import subprocess

    from .remote_helpers import cli_argv, cli_env, fake_command_template

    spec = make_spec(tmp_path, max_steps=4, every=2)
    env = cli_env(LORAPOD_JOB_COMMAND=fake_command_template(0.02, "--eval"))
    out = subprocess.run([*cli_argv(), "sweep", str(spec), "--grid", "train.learning_rate=1e-3,3e-4", "--on", "local",
                          "--parallel", "2", "--json", "--poll-s", "0.2"], env=env, capture_output=True, text=True,
                         timeout=240)
    assert out.returncode == 0, out.stderr[-2000:]
    res = json.loads(out.stdout)
    seen = [(j["overrides"], j["state"], j["message"], j["loss"]) for j in res["ranked"]]
    assert [j["state"] for j in res["ranked"]] == ["done", "done"], seen
    assert [j["overrides"]["train.learning_rate"] for j in res["ranked"]] == ["3e-4", "1e-3"], seen
    assert res["ranked"][0]["loss"] == fake_val_loss(3e-4, 4)
    assert res["winner"] == res["ranked"][0]["job_id"]
    assert Path(res["winner_adapter"], "adapter_config.json").is_file()
    assert Ledger().instances(live_only=True) == []
