"""The one tokenizer loader (``lorapod.tokenizer``) shared by ``data check``, the planner and the engine:
local folders, hub ids (against a small fake hub on loopback, through huggingface_hub's real client),
catalog aliases, HF_TOKEN and offline mode."""

from __future__ import annotations

import hashlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from lorapod.catalog.models import hub_id
from lorapod.errors import ModelLoadError
from lorapod.tokenizer import load_tokenizer

SHA = "0123456789abcdef0123456789abcdef01234567"


def save_tokenizer(folder: Path) -> Path:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {w: i for i, w in enumerate(["[UNK]", "<|im_start|>", "<|im_end|>", "hello", "world", "user", "assistant"])}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", eos_token="<|im_end|>",
                                   additional_special_tokens=["<|im_start|>"])
    fast.chat_template = "{% for m in messages %}<|im_start|>{{ m.role }} {{ m.content }}<|im_end|>{% endfor %}"
    fast.save_pretrained(folder)
    return folder


class FakeHub:
    """Serves repos as the hub's API does for huggingface_hub's snapshot_download; records requests."""

    def __init__(self, repos: dict[str, dict[str, bytes]], gated: set[str]) -> None:
        self.repos, self.gated, self.requests = repos, gated, []
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def reply(self, code, body=b"", headers=None):
                self.send_response(code)
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

            def do_GET(self):
                hub.requests.append((self.command, self.path, self.headers.get("authorization")))
                parts = self.path.split("?")[0].strip("/").split("/")
                api = parts[0] == "api"
                repo = "/".join(parts[2:4] if api else parts[0:2])
                if repo not in hub.repos:
                    return self.reply(404, b"{}", {"X-Error-Code": "RepoNotFound"})
                if repo in hub.gated and self.headers.get("authorization") != "Bearer hf_good":
                    return self.reply(403, b'{"error": "gated"}', {"X-Error-Code": "GatedRepo"})
                files = hub.repos[repo]
                if api and "tree" in parts:
                    listing = [{"type": "file", "path": f, "size": len(d), "oid": hashlib.sha1(d).hexdigest()}
                               for f, d in files.items()]
                    return self.reply(200, json.dumps(listing).encode(), {"Content-Type": "application/json"})
                if api:
                    info = {"id": repo, "sha": SHA, "siblings": [{"rfilename": f} for f in files]}
                    return self.reply(200, json.dumps(info).encode(), {"Content-Type": "application/json"})
                data = files.get(parts[-1])
                if data is None:
                    return self.reply(404, b"", {"X-Error-Code": "EntryNotFound"})
                return self.reply(200, data, {"X-Repo-Commit": SHA, "ETag": f'"{hashlib.sha1(data).hexdigest()}"'})

            do_HEAD = do_GET

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_port}"


@pytest.fixture
def hub(tmp_path, monkeypatch):
    import huggingface_hub.constants as constants

    files = {p.name: p.read_bytes() for p in save_tokenizer(tmp_path / "tok").iterdir()}
    files["model.safetensors"] = b"\0" * 64  # weights: must never be fetched for a tokenizer
    fake = FakeHub({"acme/chat": files, "acme/gated": dict(files), "Qwen/Qwen2.5-0.5B": dict(files)}, {"acme/gated"})
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setenv("HF_ENDPOINT", fake.url)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    yield fake
    fake.server.shutdown()


def test_hub_id_fetches_only_the_tokenizer_files(hub, tmp_path):
    tok = load_tokenizer("acme/chat")
    assert tok("hello world")["input_ids"] == [3, 4] and tok.pad_token == "<|im_end|>"
    fetched = {p.rsplit("/", 1)[1] for method, p, _ in hub.requests if "/resolve/" in p and method == "GET"}
    assert "tokenizer.json" in fetched and "model.safetensors" not in fetched
    assert not list((tmp_path / "hf-cache").rglob("model.safetensors"))


def test_gated_hub_model_needs_hf_token_and_sends_it(hub, monkeypatch):
    with pytest.raises(ModelLoadError, match="gated") as err:
        load_tokenizer("acme/gated")
    assert "HF_TOKEN" in err.value.hint
    monkeypatch.setenv("HF_TOKEN", "hf_good")
    assert load_tokenizer("acme/gated")("hello")["input_ids"] == [3]
    assert all(auth == "Bearer hf_good" for _, p, auth in hub.requests[-3:])


def test_offline_uses_the_cache_and_says_clearly_when_it_is_not_there(hub, monkeypatch):
    load_tokenizer("acme/chat")  # online once: now cached
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    n = len(hub.requests)
    assert load_tokenizer("acme/chat")("world")["input_ids"] == [4]
    assert len(hub.requests) == n  # the hub was not asked
    with pytest.raises(ModelLoadError, match="offline") as err:
        load_tokenizer("acme/never-downloaded")
    assert "huggingface-cli download acme/never-downloaded" in err.value.hint


def test_catalog_alias_loads_its_hub_id(hub):
    assert hub_id("qwen2.5-0.5b") == "Qwen/Qwen2.5-0.5B"
    assert load_tokenizer("qwen2.5-0.5b")("hello")["input_ids"] == [3]
    with pytest.raises(ModelLoadError, match="catalog alias"):
        load_tokenizer("no-such-model-name")


def test_data_check_takes_a_hub_id_like_the_engine(hub, tmp_path):
    """examples/llm-chat-lora.yaml tells users to run `lorapod data check chats.jsonl --model <hub id>`."""
    from lorapod.data.chat import check_chat

    p = tmp_path / "c.jsonl"
    p.write_text(json.dumps({"messages": [{"role": "user", "content": "hello"},
                                          {"role": "assistant", "content": "world"}]}) + "\n")
    report = check_chat(p, model="acme/chat", sequence_len=64)
    assert report.summary["tokens"]["max"] == 8  # <|im_start|> user hello <|im_end|>, then the same for the reply
    assert report.summary["example_rendered"] == "<|im_start|>user hello<|im_end|><|im_start|>assistant world<|im_end|>"


def test_local_folder_and_engine_share_the_loader(tmp_path):
    from lorapod.engine.llm_model import load_tokenizer as engine_load
    from lorapod.spec import load_spec

    folder = save_tokenizer(tmp_path / "m")
    spec = load_spec(raw={"model": {"id": str(folder)}, "data": {"path": str(tmp_path / "c.jsonl")}})
    assert engine_load(spec)("hello")["input_ids"] == load_tokenizer(str(folder))("hello")["input_ids"] == [3]
    with pytest.raises(ModelLoadError, match="not a model folder"):
        load_tokenizer(str(tmp_path / "missing"))
