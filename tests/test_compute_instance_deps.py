"""What the instance gets installed for a job (review N2): bitsandbytes for QLoRA and 8-bit AdamW,
pinned at the controller's version and checked before anything is rented; an attention backend
the instance cannot have is refused there too."""

from __future__ import annotations

import importlib.metadata as md
from pathlib import Path

import pytest
import yaml

from lorapod.compute import bootstrap
from lorapod.compute.bootstrap import derive_lock, extra_for, needs_bitsandbytes
from lorapod.compute.offers import planned_job
from lorapod.compute.preflight import PreflightError, preflight
from lorapod.compute.runpod.provider import RunPodProvider
from lorapod.spec import load_spec

from .remote_helpers import make_spec

OFFLINE = {"HF_HUB_OFFLINE": "1"}


def spec_at(tmp_path: Path, **changes):
    path = make_spec(tmp_path, model="lorapod:tiny-llama")
    raw = yaml.safe_load(path.read_text())
    for dotted, value in changes.items():
        section, key = dotted.split("__")
        raw.setdefault(section, {})[key] = value
    path.write_text(yaml.safe_dump(raw))
    return load_spec(path)


#: bitsandbytes 0.50.2's own METADATA (its manylinux_2_24_x86_64 wheel on PyPI), the lines pip reads
BNB_METADATA = """Metadata-Version: 2.4
Name: bitsandbytes
Version: 0.50.2
Requires-Python: >=3.10
Requires-Dist: torch<3,>=2.4
Requires-Dist: numpy>=1.17
Requires-Dist: packaging>=20.9
Requires-Dist: pandas; extra == "benchmark"
Requires-Dist: transformers<5,>=4.30.1; extra == "test"
"""


@pytest.fixture
def bitsandbytes_installed(tmp_path, monkeypatch):
    """bitsandbytes 0.50.2 as pip leaves it installed (its dist-info), on this interpreter's path."""
    site = tmp_path / "site"
    info = site / "bitsandbytes-0.50.2.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(BNB_METADATA)
    (info / "INSTALLER").write_text("pip\n")
    monkeypatch.syspath_prepend(str(site))
    return site


@pytest.fixture
def bitsandbytes_missing(monkeypatch):
    """This machine without bitsandbytes, whatever is installed (it is not in lorapod[all])."""
    real = md.distribution

    def distribution(name):
        if bootstrap.canonical(name) == "bitsandbytes":
            raise md.PackageNotFoundError(name)
        return real(name)

    monkeypatch.setattr(bootstrap.md, "distribution", distribution)


def test_qlora_and_8bit_adamw_jobs_install_bitsandbytes(tmp_path):
    lora = spec_at(tmp_path / "a")
    qlora = spec_at(tmp_path / "b", method__type="qlora")
    adam8 = spec_at(tmp_path / "c", train__optimizer="adamw_8bit")
    assert (needs_bitsandbytes(lora), needs_bitsandbytes(qlora), needs_bitsandbytes(adam8)) == (False, True, True)
    assert extra_for(lora) == "llm"
    assert extra_for(qlora) == "llm,cuda"
    assert extra_for(adam8) == "llm,cuda"


def test_the_lock_pins_the_controllers_bitsandbytes_and_never_its_torch(bitsandbytes_installed, tmp_path):
    lock = derive_lock(extra_for(spec_at(tmp_path, method__type="qlora")))
    pins = dict(p.split("==") for p in lock.pins)
    assert pins["bitsandbytes"] == "0.50.2"
    assert "numpy" in pins and "packaging" in pins  # its own requirements, at this machine's versions
    assert "torch" not in pins and "pandas" not in pins  # torch is the image's; extras are not followed
    assert lock.missing == ()
    assert lock.digest != derive_lock("llm").digest  # a QLoRA job gets its own environment


def test_a_qlora_job_is_refused_before_renting_when_this_machine_cannot_pin_bitsandbytes(bitsandbytes_missing,
                                                                                        tmp_path):
    spec = spec_at(tmp_path, method__type="qlora")
    with pytest.raises(PreflightError) as err:
        preflight(spec, RunPodProvider(api=object()), planned_job(spec), env=OFFLINE)
    assert "bitsandbytes" in err.value.message and "QLoRA needs bitsandbytes on the instance" in err.value.message
    assert "lorapod[llm,cuda]" in (err.value.hint or "")
    adam8 = spec_at(tmp_path / "x", train__optimizer="adamw_8bit")
    with pytest.raises(PreflightError, match=r"train\.optimizer adamw_8bit needs bitsandbytes"):
        preflight(adam8, RunPodProvider(api=object()), planned_job(adam8), env=OFFLINE)


def test_flash_attention_is_refused_on_an_image_that_cannot_have_it(tmp_path):
    spec = spec_at(tmp_path, train__attention="flash")
    with pytest.raises(PreflightError) as err:
        preflight(spec, RunPodProvider(api=object()), planned_job(spec), env=OFFLINE)
    assert "flash_attn" in err.value.message and "PyPI has no flash-attn wheel" in err.value.message
    # a user's own image may ship it: not refused here (the engine checks on the instance)
    own = spec_at(tmp_path / "own", train__attention="flash", compute__image="me/my-image:flash")
    preflight(own, RunPodProvider(api=object()), planned_job(own), env=OFFLINE)
