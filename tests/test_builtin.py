"""The built-in ``lorapod:`` models (``lorapod.builtin``): one resolver, used by the tokenizer loader
and the engine alike, that builds each model once and atomically under LORAPOD_HOME."""

from __future__ import annotations

from pathlib import Path

import pytest

from lorapod import builtin
from lorapod.engine.llm_model import resolve_model_id
from lorapod.errors import ModelLoadError
from lorapod.home import lorapod_home
from lorapod.tokenizer import load_tokenizer
from lorapod.tokenizer import resolve as resolve_tokenizer

BUILDS: list[Path] = []


def _build_marker(folder: Path) -> None:
    """A stand-in builder (``builtin.MODELS`` value): one file, and a record of the call."""
    BUILDS.append(folder)
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")


def _build_fails(folder: Path) -> None:
    folder.mkdir(parents=True)
    (folder / "half-written.bin").write_bytes(b"\0")
    raise RuntimeError("disk full")


@pytest.fixture
def fake(monkeypatch):
    BUILDS.clear()
    monkeypatch.setitem(builtin.MODELS, "fake", f"{__name__}:_build_marker")
    monkeypatch.setitem(builtin.MODELS, "broken", f"{__name__}:_build_fails")


def test_the_tokenizer_and_the_engine_resolve_a_builtin_id_through_one_resolver_that_builds_once(fake):
    folder = builtin.resolve("lorapod:fake")
    assert folder == str(lorapod_home() / "models" / "fake")
    assert resolve_tokenizer("lorapod:fake") == (folder, "built-in")
    assert resolve_model_id("lorapod:fake") == folder
    assert len(BUILDS) == 1  # built on first use, then found
    assert not [p for p in (lorapod_home() / "models").iterdir() if p.name.startswith(".tmp")]


def test_an_unknown_builtin_id_is_refused_with_the_ones_there_are(fake):
    for resolve in (builtin.resolve, resolve_model_id, load_tokenizer):
        with pytest.raises(ModelLoadError, match="'lorapod:tiny-lama' is not one of lorapod's built-in") as err:
            resolve("lorapod:tiny-lama")
        assert "lorapod:tiny-llama" in err.value.hint
    assert not (lorapod_home() / "models").exists()


def test_a_build_that_fails_leaves_nothing_behind_and_the_next_use_builds_again(fake, monkeypatch):
    with pytest.raises(RuntimeError, match="disk full"):
        builtin.resolve("lorapod:broken")
    models = lorapod_home() / "models"
    assert not models.exists() or not list(models.iterdir())  # neither the folder nor its temporary one
    monkeypatch.setitem(builtin.MODELS, "broken", f"{__name__}:_build_marker")
    assert Path(builtin.resolve("lorapod:broken"), "config.json").is_file()


def test_tiny_llama_is_a_loadable_model_and_tokenizer_built_in_code():
    folder = Path(resolve_model_id("lorapod:tiny-llama"))
    assert (folder / "config.json").is_file() and list(folder.glob("*.safetensors"))
    tok = load_tokenizer("lorapod:tiny-llama")
    assert tok.chat_template and tok.eos_token == "<|im_end|>"
    assert tok.decode(tok("The banana is yellow.")["input_ids"]) == "The banana is yellow."
