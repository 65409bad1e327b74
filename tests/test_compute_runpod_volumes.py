"""RunPod network volumes: list, create once, delete once, against a fake checked by RunPod's OpenAPI document."""

from __future__ import annotations

import pytest

from lorapod.compute.httpapi import ApiError
from lorapod.compute.runpod.api import RunPodApi
from lorapod.compute.runpod.volumes import NetworkVolumes
from lorapod.errors import LorapodError

from .cli_helpers import run_cli
from .fakes.base import Fault
from .fakes.runpod_volumes_fake import RunPodVolumesFake


@pytest.fixture
def fake(tmp_path, monkeypatch):
    f = RunPodVolumesFake(tmp_path)
    monkeypatch.setenv("RUNPOD_API_KEY", f.account_key)
    monkeypatch.setenv("LORAPOD_RUNPOD_URL", f.url)
    yield f
    f.close()
    assert f.violations == []


def _vols(fake) -> NetworkVolumes:
    return NetworkVolumes(RunPodApi(backoff_s=0.0))


def test_create_list_price_and_delete(fake):
    vols = _vols(fake)
    v = vols.create("lorapod-models", 260, "EU-RO-1")
    assert (v.name, v.size_gb, v.datacenter) == ("lorapod-models", 260, "EU-RO-1")
    assert v.usd_per_month == pytest.approx(18.2)  # 260 GB x $0.07: the guide's "about $18 a month"
    assert [x.id for x in vols.find("lorapod-models")] == [v.id]
    assert vols.delete(v.id) is True
    assert vols.delete(v.id) is False  # already gone
    assert vols.list() == []


def test_create_and_delete_are_sent_once(fake):
    vols = _vols(fake)
    fake.faults.append(Fault("POST", "/networkvolumes", 500))
    with pytest.raises((ApiError, LorapodError)):
        vols.create("v", 10, "EU-RO-1")
    assert [c for c in fake.calls if c[0] == "POST"] == [("POST", "/networkvolumes", 500)]
    v = vols.create("v", 10, "EU-RO-1")
    fake.faults.append(Fault("DELETE", f"/networkvolumes/{v.id}", 500))
    with pytest.raises((ApiError, LorapodError)):
        vols.delete(v.id)
    assert sum(1 for c in fake.calls if c[0] == "DELETE") == 1
    assert [x.id for x in vols.list()] == [v.id]  # still there, and `lorapod volumes` shows it


def test_cli_lists_costs_and_deletes(fake, capsys):
    v = _vols(fake).create("models", 100, "US-TX-3")
    code, out, err = run_cli(["volumes"], capsys)
    assert code == 0, err
    assert v.id in out and "US-TX-3" in out and "7.00" in out
    code, out, err = run_cli(["volumes", "--delete", v.id, "--yes"], capsys)
    assert code == 0 and "deleted" in err
    assert fake.volumes == {}
    code, out, err = run_cli(["volumes", "--delete", "nope", "--yes"], capsys)
    assert code != 0 and "no network volume nope" in err


def test_ps_shows_what_volumes_cost_each_month(fake, capsys):
    _vols(fake).create("models", 260, "EU-RO-1")
    _vols(fake).create("scratch", 40, "US-TX-3")
    code, out, err = run_cli(["ps"], capsys)
    assert code == 0, err
    assert "2 RunPod network volume(s), $21.00/month" in out  # 300 GB x $0.07
    assert "models 260 GB EU-RO-1" in out
