"""The scorer models load from the Hub, a folder or lorapod's built-ins, and say why when they do not:
with the Hub unreachable a scorer comes from the local cache or not at all, in seconds (not
huggingface_hub's half-minute of retries per file), and the run's autopilot is off, never guessing."""

from __future__ import annotations

import socket
import time

import pytest

from lorapod.quality import scorers
from lorapod.spec import validate


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_an_unreachable_hub_is_asked_once_and_the_cache_alone_is_used(monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{closed_port()}")
    monkeypatch.setattr(scorers, "_REACHABLE", {})
    t = time.monotonic()
    assert scorers.hub_reachable() is False
    with pytest.raises(OSError, match="not reachable from here and someone/clip-model is not in its cache"):
        scorers.load_embedder("someone/clip-model", "clip")
    assert time.monotonic() - t < 20
    assert len(scorers._REACHABLE) == 1  # asked once


def test_the_built_in_scorers_load_and_name_themselves():
    got = scorers.load(validate({"model": {"id": "x"}, "data": {"path": "d"},
                                 "quality": {"clip": "lorapod:tiny-siglip", "dino": "lorapod:tiny-dinov2",
                                             "face": "off"}}).quality, lambda m: None)
    assert got.names() == {"siglip": "lorapod:tiny-siglip", "dino": "lorapod:tiny-dinov2",
                           "phash": "imagehash.phash (64-bit DCT hash)"}
    assert got.clip.texts(["zxq on a beach"]).shape[0] == 1
    with pytest.raises(ValueError, match="not DINOv2"):
        scorers.load_embedder("lorapod:tiny-clip", "dino")


def test_nothing_loads_and_the_notes_say_why():
    got = scorers.load(validate({"model": {"id": "x"}, "data": {"path": "d"},
                                 "quality": {"clip": "no/such", "dino": None}}).quality, lambda m: None)
    assert not got.any_image and got.face is None  # nothing to score with: the face scorer is not even loaded
    assert any(n.startswith("clip: no/such did not load") for n in got.notes)
    assert "dino: none configured (quality.dino: null)" in got.notes


def test_yaml_off_reads_as_off():
    q = validate({"model": {"id": "x"}, "data": {"path": "d"}, "quality": {"score": False, "face": True}}).quality
    assert (q.score, q.face) == ("off", "on")
