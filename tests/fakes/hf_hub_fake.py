"""A loopback Hugging Face Hub that answers huggingface_hub's upload calls the way the Hub does.

Modelled on the client that talks to it (huggingface_hub 2.4, the version installed here), call by call:

- ``POST /api/repos/create`` {name, organization, visibility, type} (``HfApi.create_repo``): 200
  {"url"}; 409 when the repo exists, which ``exist_ok=True`` accepts; 401 without a token.
- ``POST /api/validate-yaml`` {content, repoType} (``HfApi._validate_yaml``, called by
  ``create_commit`` for README.md): 400 {"errors": [{"message"}]} for metadata the Hub rejects
  (unparsable YAML, an unknown licence id, ``other`` without ``license_name``), else 200 {}.
- ``POST /api/models/{repo}/preupload/{rev}`` {files: [{path, sample, size}]}
  (``_commit_api._fetch_upload_modes``): each file's ``uploadMode``: ``lfs`` for a path that the
  Hub's default ``.gitattributes`` stores in LFS, a file over 10 MB, or binary content (a NUL byte
  in the 512-byte sample), else ``regular``; ``shouldIgnore`` false; ``oid`` of what is stored.
- ``POST /{repo}.git/info/lfs/objects/batch`` (``lfs.post_lfs_batch_info``, basic transfer):
  upload and verify actions for unknown objects, none for known ones; ``PUT`` the bytes to the
  upload href (``lfs._upload_single_part``), ``POST`` the verify href {oid, size}.
- ``GET /api/models/{repo}/revision/{rev}`` (``HfApi.repo_info``, which ``create_commit`` asks when
  every file is unchanged): {id, private, sha, siblings}.
- ``POST /api/models/{repo}/commit/{rev}`` NDJSON: header, ``file`` (base64), ``lfsFile``
  (sha256 oid, which must have been uploaded), ``deletedFile`` (``_send_commit``): 200
  {commitUrl, commitOid}.

Xet storage (used by huggingface_hub when ``hf_xet`` is installed) is not modelled: tests turn it
off (``HF_HUB_DISABLE_XET``), so the client takes its LFS path, which the Hub still serves.
"""

from __future__ import annotations

import base64
import fnmatch
import hashlib
import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlsplit

import yaml

# the .gitattributes a new Hub repo starts with (the LFS patterns of huggingface.co's template)
LFS_PATTERNS = ("*.7z", "*.arrow", "*.bin", "*.bz2", "*.ckpt", "*.ftz", "*.gz", "*.h5", "*.joblib", "*.lfs.*",
                "*.mlmodel", "*.model", "*.msgpack", "*.npy", "*.npz", "*.onnx", "*.ot", "*.parquet", "*.pb",
                "*.pickle", "*.pkl", "*.pt", "*.pth", "*.rar", "*.safetensors", "*.tar.*", "*.tar", "*.tflite",
                "*.tgz", "*.wasm", "*.xz", "*.zip", "*.zst", "*tfevents*")
# a part of the Hub's licence list (huggingface.co/docs/hub/repositories-licenses)
LICENSES = {"apache-2.0", "mit", "openrail", "openrail++", "creativeml-openrail-m", "bigscience-openrail-m",
            "llama2", "llama3", "llama3.1", "llama3.2", "llama3.3", "gemma", "cc-by-4.0", "cc-by-nc-4.0",
            "bsd-3-clause", "gpl-3.0", "other", "unknown"}
REGULAR_MAX = 10 * 1024 * 1024


@dataclass
class Repo:
    id: str
    private: bool
    files: dict[str, bytes] = field(default_factory=dict)
    commits: list[dict] = field(default_factory=list)
    gated: bool | str = False  # the Hub answers false, "auto" or "manual" (ModelInfo.gated)


def git_blob_oid(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


class FakeHub:
    def __init__(self, token: str) -> None:
        self.token = token
        self.repos: dict[str, Repo] = {}
        self.lfs: dict[str, bytes] = {}
        self.requests: list[tuple[str, str]] = []
        self.lfs_paths: set[str] = set()  # paths stored as LFS pointers
        self._lock = threading.Lock()
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a) -> None:
                return None

            def _send(self, status: int, body: dict | None = None) -> None:
                data = json.dumps(body or {}).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _body(self) -> bytes:
                n = int(self.headers.get("Content-Length") or 0)
                return self.rfile.read(n) if n else b""

            def _authorised(self) -> bool:
                return self.headers.get("Authorization") == f"Bearer {hub.token}"

            def do_POST(self) -> None:
                self._route("POST")

            def do_PUT(self) -> None:
                self._route("PUT")

            def do_GET(self) -> None:
                self._route("GET")

            def _route(self, method: str) -> None:
                path = unquote(urlsplit(self.path).path)
                body = self._body()
                with hub._lock:
                    hub.requests.append((method, path))
                    status, out = hub.handle(method, path, body, self._authorised(), self.headers)
                self._send(status, out)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    # ------------------------------------------------------------------ the Hub's answers

    def handle(self, method: str, path: str, body: bytes, authorised: bool, headers) -> tuple[int, dict]:
        if path == "/api/validate-yaml" and method == "POST":
            return self._validate_yaml(json.loads(body))
        if path.startswith("/lfs-upload/") and method == "PUT":
            oid = path.rsplit("/", 1)[1]
            if hashlib.sha256(body).hexdigest() != oid:
                return 400, {"error": "sha256 mismatch"}
            self.lfs[oid] = body
            return 200, {}
        if path == "/lfs-verify" and method == "POST":
            req = json.loads(body)
            ok = req.get("oid") in self.lfs and len(self.lfs[req["oid"]]) == req.get("size")
            return (200, {}) if ok else (404, {"error": "Object not found"})
        if not authorised:
            return 401, {"error": "Invalid credentials in Authorization header"}
        if path == "/api/repos/create" and method == "POST":
            req = json.loads(body)
            if req.get("type", "model") != "model":
                return 400, {"error": "this fake holds model repos only"}
            repo_id = f"{req['organization']}/{req['name']}" if req.get("organization") else f"user/{req['name']}"
            if repo_id in self.repos:
                return 409, {"error": "You already created this model repo", "url": f"{self.url}/{repo_id}"}
            self.repos[repo_id] = Repo(repo_id, req.get("visibility") == "private")
            return 200, {"url": f"{self.url}/{repo_id}", "name": repo_id}
        if path.endswith(".git/info/lfs/objects/batch") and method == "POST":
            req = json.loads(body)
            objects = []
            for o in req["objects"]:
                if o["oid"] in self.lfs:
                    objects.append({"oid": o["oid"], "size": o["size"]})
                else:
                    objects.append({"oid": o["oid"], "size": o["size"], "actions": {
                        "upload": {"href": f"{self.url}/lfs-upload/{o['oid']}"},
                        "verify": {"href": f"{self.url}/lfs-verify"}}})
            return 200, {"transfer": "basic", "objects": objects}
        if path.startswith("/api/models/"):
            rest = path[len("/api/models/"):]
            if method == "GET":  # HfApi.repo_info / model_info (create_commit calls it when nothing changed)
                repo = self.repos.get(rest.split("/revision/")[0])
                if repo is None:
                    return 404, {"error": "Repository not found"}
                return 200, {"id": repo.id, "modelId": repo.id, "private": repo.private, "gated": repo.gated,
                             "sha": repo.commits[-1]["oid"] if repo.commits else None,
                             "siblings": [{"rfilename": p} for p in sorted(repo.files)]}
            for verb in ("preupload", "commit"):
                marker = f"/{verb}/"
                if marker in rest and method == "POST":
                    repo_id, _rev = rest.split(marker, 1)
                    repo = self.repos.get(repo_id)
                    if repo is None:
                        return 404, {"error": "Repository not found"}
                    return self._preupload(repo, json.loads(body)) if verb == "preupload" else self._commit(repo, body)
        return 404, {"error": f"no route {method} {path}"}

    def _validate_yaml(self, req: dict) -> tuple[int, dict]:
        text = req.get("content", "")
        if not text.startswith("---"):
            return 200, {"warnings": [{"message": "empty or missing yaml metadata in repo card"}]}
        try:
            meta = yaml.safe_load(text.split("---", 2)[1]) or {}
        except yaml.YAMLError as exc:
            return 400, {"errors": [{"message": f"YAML: {exc}"}]}
        errors = []
        lic = meta.get("license")
        if lic is not None and lic not in LICENSES:
            errors.append({"message": f'"license" must be one of [{", ".join(sorted(LICENSES))}]'})
        if lic == "other" and not meta.get("license_name"):
            errors.append({"message": '"license_name" is required when "license" is "other"'})
        bm = meta.get("base_model")
        if bm is not None and not (isinstance(bm, str) or (isinstance(bm, list) and all(isinstance(x, str) for x in bm))):
            errors.append({"message": '"base_model" must be a string or a list of strings'})
        return (400, {"errors": errors}) if errors else (200, {})

    def _mode(self, path: str, size: int, sample: bytes) -> str:
        name = path.rsplit("/", 1)[-1]
        if any(fnmatch.fnmatch(name, p) for p in LFS_PATTERNS) or size > REGULAR_MAX or b"\0" in sample:
            return "lfs"
        return "regular"

    def _preupload(self, repo: Repo, req: dict) -> tuple[int, dict]:
        out = []
        for f in req["files"]:
            sample = base64.b64decode(f["sample"])
            stored = repo.files.get(f["path"])
            oid = None
            if stored is not None:
                oid = hashlib.sha256(stored).hexdigest() if f["path"] in self.lfs_paths else git_blob_oid(stored)
            out.append({"path": f["path"], "uploadMode": self._mode(f["path"], f["size"], sample),
                        "shouldIgnore": False, "oid": oid})
        return 200, {"files": out, "commitOid": None}

    def _commit(self, repo: Repo, body: bytes) -> tuple[int, dict]:
        lines = [json.loads(x) for x in body.decode().splitlines() if x.strip()]
        if not lines or lines[0].get("key") != "header":
            return 400, {"error": "the first line must be the commit header"}
        header = lines[0]["value"]
        changes: dict[str, bytes | None] = {}
        for item in lines[1:]:
            key, value = item["key"], item["value"]
            if key == "file":
                data = base64.b64decode(value["content"])
                if b"\0" in data[:512] or len(data) > REGULAR_MAX:  # the Hub rejects binaries outside LFS
                    return 400, {"error": f"{value['path']}: binary files must be stored with LFS/Xet"}
                changes[value["path"]] = data
            elif key == "lfsFile":
                if value.get("algo") != "sha256" or value["oid"] not in self.lfs:
                    return 422, {"error": f"{value['path']}: LFS object {value['oid']} was never uploaded"}
                if len(self.lfs[value["oid"]]) != value["size"]:
                    return 422, {"error": f"{value['path']}: size mismatch"}
                changes[value["path"]] = self.lfs[value["oid"]]
                self.lfs_paths.add(value["path"])
            elif key == "deletedFile":
                changes[value["path"]] = None
            else:
                return 400, {"error": f"unknown operation {key}"}
        for path, data in changes.items():
            if data is None:
                repo.files.pop(path, None)
            else:
                repo.files[path] = data
        oid = hashlib.sha1(json.dumps([header, sorted(changes)]).encode() + str(len(repo.commits)).encode()).hexdigest()
        repo.commits.append({"oid": oid, "summary": header.get("summary"), "paths": sorted(changes)})
        return 200, {"commitUrl": f"{self.url}/{repo.id}/commit/{oid}", "commitOid": oid, "success": True}
