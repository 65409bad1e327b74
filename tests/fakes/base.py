"""The shared machinery of the fake control planes.

A threaded ``http.server`` on 127.0.0.1 that validates every request *and* every response
against the provider's published OpenAPI document (openapi-core), records violations instead of
hiding them, injects faults (429, 500, ...) on demand, and backs each "instance" with a real
sshd on loopback whose sessions carry the provider's in-instance variables (``SetEnv``). Deleting
an instance kills every process started through its sshd (found by a marker variable in
``/proc/*/environ``) and removes their work folders, as a destroyed container would.

Where a vendor's document and its official client disagree, the fake follows the client: each
fake lists its ``errata`` (a JSON path in the document, the shape the client relies on, and the
client code that shows it), applied to the document before it validates anything.

The world's slower habits are modelled too: ``pull_s`` (an image pull: the provider reports
loading, no SSH yet) and ``key_delay_s`` (a key attached after create reaches the container's
authorized_keys only that much later).

A container runs its start command when it starts (after the pull and boot) and again when a
stopped one starts again, as ``docker start`` runs a container's command: the process carries the
instance's variables (its scoped key among them) and nothing of this machine's environment but
PATH, and dies with the instance. The test host's ``/root`` and ``/tmp`` are shared by every fake
instance, so a start command's container-private files at fixed paths (``/root/...``,
``/tmp/.lorapod-init.sh``) are mapped into the instance's own folder; each instance also gets its
own ``LORAPOD_JOBS_DIR`` (a spot init's SIGTERM must reach only its own container's jobs).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import signal
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

REPO = Path(__file__).resolve().parents[2]


def contracts_dir() -> Path:
    env = os.environ.get("LORAPOD_CONTRACTS_DIR")
    # The repository's own copies (tests/contracts/): a fresh clone tests anywhere.
    d = Path(env) if env else REPO / "tests" / "contracts"
    if not d.is_dir():
        import pytest

        pytest.fail(f"provider contracts not found at {d}; set LORAPOD_CONTRACTS_DIR to a folder that has them")
    return d


_SPECS: dict[str, Any] = {}


@dataclass(frozen=True)
class Erratum:
    """One place where the vendor's document is wrong about what the live API does."""

    path: tuple[str, ...]  # keys from the document's root to the value replaced
    value: Any
    source: str  # the official client code (or doc) that shows the real shape


def load_contract(name: str, errata: tuple[Erratum, ...] = ()):
    """openapi-core app for a contract file with ``errata`` applied (cached). RunPod's published
    document repeats an operationId, so the document itself is not linted; requests and
    responses still are."""
    if name not in _SPECS:
        from openapi_core import Config, OpenAPI

        path = contracts_dir() / name
        if path.suffix == ".json":
            doc = json.loads(path.read_text())
        else:
            import yaml

            doc = yaml.load(path.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
        for e in errata:
            node = doc
            for key in e.path[:-1]:
                node = node[key]
            if e.path[-1] not in node and not isinstance(node, dict):
                raise KeyError(f"erratum path {e.path} not in {name}")
            node[e.path[-1]] = e.value
        _SPECS[name] = OpenAPI.from_dict(doc, config=Config(spec_validator_cls=None),
                                         base_uri=path.as_uri())
    return _SPECS[name]


class TcpForwarder:
    """A relay to a local port: a provider's SSH proxy (e.g. Vast.ai's ``sshN.vast.ai``), which
    reaches the same sshd as the direct address by another route. ``connections`` counts who came
    this way."""

    def __init__(self, target_port: int) -> None:
        import socket

        self.target_port = target_port
        self.connections = 0
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.closed = False
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        import socket

        while not self.closed:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target_port), timeout=5)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(a, b) -> None:
        try:
            while data := a.recv(65536):
                b.sendall(data)
        except OSError:
            pass
        finally:
            for s in (a, b):
                with contextlib.suppress(OSError):
                    s.shutdown(2)

    def close(self) -> None:
        self.closed = True
        with contextlib.suppress(OSError):
            self.sock.close()


@dataclass
class Fault:
    method: str
    path: str  # regex on the path
    status: int
    times: int = 1
    body: Any = field(default_factory=lambda: {"error": "injected"})
    #: with ``status=0``: answer normally, but only ``delay_s`` after acting on the request
    #: (a create the provider accepted whose answer comes after the client gave up)
    delay_s: float = 0.0
    #: with a status: act on the request first, then answer that status instead of the result (a
    #: gateway that gave up on a backend that did the work: Cloudflare, in front of RunPod's API,
    #: answers 524 "A timeout occurred" while the origin goes on and completes the request)
    acted: bool = False
    #: only requests whose raw body holds this text (one GraphQL operation among the others on
    #: the same path, e.g. "podRentInterruptable")
    body_has: str = ""


@dataclass
class FakeInstance:
    id: str
    sshd: Any  # conftest_ssh.Sshd
    marker: str
    env: dict[str, str]
    usd_per_hour: float
    gpu: str
    label: str
    created: float = field(default_factory=time.time)
    ready_at: float | None = None
    never_ready: bool = False
    deleted: bool = False
    deleted_by: str | None = None
    deleted_at: float | None = None  # wall clock: billing ends here
    pulled_at: float = 0.0  # until then the image is being pulled
    why_not: str | None = None  # why a never-ready container does not start (the provider's words)
    proxy: TcpForwarder | None = None
    #: when the provider stopped (RunPod) or paused (Vast.ai) the container; None while it runs
    stopped_at: float | None = None
    stopped_hours: float = 0.0  # every stop so far, ended ones: what storage-only billing covered
    #: what the processes in it received when it was stopped: (pid, "TERM" | "KILL")
    signals: list[tuple[int, str]] = field(default_factory=list)
    #: work folders on a disk kept through a stop (no process left to find them by): erased on destroy
    kept_dirs: set[Path] = field(default_factory=set)
    #: the container's start command as the provider runs it (RunPod: its CMD; Vast.ai: onstart),
    #: started when the container starts, again after a stop; None: the image's own, a no-op here
    start_cmd: list[str] | None = None
    home: Path | None = None  # the container's own folder on the test host (its /root, its private files)
    host: Any = None  # tests/host_profiles.Host when the fake builds the image's world

    @property
    def ready(self) -> bool:
        return (not self.never_ready and self.stopped_at is None and self.ready_at is not None
                and time.time() >= self.ready_at)

    def hours_stopped(self, now: float | None = None) -> float:
        """Hours the container has been stopped or paused, all stops together (storage-only billing)."""
        now = time.time() if now is None else now
        return self.stopped_hours + ((now - self.stopped_at) / 3600 if self.stopped_at is not None else 0.0)

    @property
    def pulling(self) -> bool:
        return time.time() < self.pulled_at


class FakeControlPlane:
    """Subclasses: ``contract`` file, ``server_url`` of the contract, ``route(method, path, body, query, auth)``."""

    contract = ""
    server_url = ""  # the contract's server URL, e.g. https://rest.runpod.io/v1
    unvalidated: tuple[str, ...] = ()  # regexes of paths the contract does not cover
    errata: tuple[Erratum, ...] = ()  # where the fake follows the official client, not the document

    def __init__(self, sshd_factory, work_root: Path, account_key: str | None = None, boot_s: float = 0.3,
                 pull_s: float = 0.0, key_delay_s: float = 0.0, host_profile: Any = None) -> None:
        #: tests/host_profiles.Profile: each instance's host is built as that image has it (the
        #: provider's variables in PID 1's environment only, its PATH...); None: sshd SetEnv
        self.host_profile = host_profile
        self._hosts: list[Any] = []
        self._homes: list[Path] = []
        self.account_key = account_key or "acct-" + secrets.token_hex(16)
        self.sshd_factory = sshd_factory
        self.work_root = work_root
        self.boot_s = boot_s
        self.pull_s = pull_s
        self.key_delay_s = key_delay_s
        self.bodies: list[tuple[str, str, Any]] = []  # (method, path, JSON body) of every request
        self.instances: dict[str, FakeInstance] = {}
        self.faults: list[Fault] = []
        self.violations: list[str] = []
        self.calls: list[tuple[str, str, int]] = []
        self.user_agents: list[str] = []
        self.lock = threading.RLock()
        self.openapi = load_contract(self.contract, self.errata)
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a: Any) -> None:
                pass

            def _do(self) -> None:
                fake._handle(self)

            do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = _do

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}" + urlsplit(self.server_url).path

    # ------------------------------------------------------------------ HTTP

    def _handle(self, h: BaseHTTPRequestHandler) -> None:
        split = urlsplit(h.path)
        base = urlsplit(self.server_url).path
        path = split.path[len(base):] if split.path.startswith(base) else split.path
        n = int(h.headers.get("Content-Length") or 0)
        raw = h.rfile.read(n) if n else b""
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = None
        query = {k: v[0] for k, v in parse_qs(split.query).items()}
        auth = (h.headers.get("Authorization") or "").removeprefix("Bearer ").strip()
        self.user_agents.append(h.headers.get("User-Agent") or "")
        self.bodies.append((h.command, path, body))
        validate = not any(re.fullmatch(p, path) for p in self.unvalidated)
        req = None
        if validate:
            req = self._mock_request(h.command, path, raw, split.query, h.headers.get("Authorization"))
            try:
                self.openapi.validate_request(req)
            except Exception as exc:
                self.violations.append(f"request {h.command} {path}: {exc}")
                self._send(h, 400, {"error": f"contract violation: {exc}"})
                return
        status, out = self._fault(h.command, path, raw)
        delay = 0.0
        if status == 0:
            delay, status, out = float(out), None, None
        if isinstance(out, tuple):  # an acted fault: the real work, then the fault's answer
            out = out[1]
            with self.lock:
                try:
                    self.route(h.command, path, body, query, auth)
                except Exception as exc:
                    self.violations.append(f"fake crashed on {h.command} {path}: {exc!r}")
            validate = False  # the answer is the gateway's, not the API's
        if status is None:
            with self.lock:
                try:
                    status, out = self.route(h.command, path, body, query, auth)
                except Exception as exc:  # a fake bug must be loud
                    self.violations.append(f"fake crashed on {h.command} {path}: {exc!r}")
                    status, out = 500, {"error": repr(exc)}
        if validate and req is not None and status < 500 and status != 429 and not (status == 404 and out
                                                                                      and out.get("_undocumented")):
            from openapi_core.testing import MockResponse

            data = b"" if out is None else json.dumps(out).encode()
            try:
                self.openapi.validate_response(req, MockResponse(data, status_code=status,
                                                                 content_type="application/json" if out is not None else None))
            except Exception as exc:
                self.violations.append(f"response {h.command} {path} {status}: {exc}")
        if isinstance(out, dict):
            out.pop("_undocumented", None)
        self.calls.append((h.command, path, status))
        if delay:
            time.sleep(delay)  # outside the lock: the rest of the API keeps answering
        self._send(h, status, out)

    def _mock_request(self, method: str, path: str, raw: bytes, query: str, auth: str | None):
        from openapi_core.testing import MockRequest

        s = urlsplit(self.server_url)
        args = {k: v[0] for k, v in parse_qs(query).items()}
        return MockRequest(f"{s.scheme}://{s.netloc}", method, s.path + path.rstrip("/") if path != "/" else s.path,
                           args=args, headers={"Authorization": auth} if auth else {}, data=raw or None,
                           content_type="application/json")

    def _fault(self, method: str, path: str, raw: bytes = b"") -> tuple[int | None, Any]:
        with self.lock:
            for f in self.faults:
                if f.times > 0 and f.method == method and re.fullmatch(f.path, path) and (
                        not f.body_has or f.body_has.encode() in raw):
                    f.times -= 1
                    if f.acted:
                        return f.status, ("acted", f.body)
                    return f.status, (f.delay_s if f.status == 0 else f.body)
        return None, None

    def _send(self, h: BaseHTTPRequestHandler, status: int, out: Any) -> None:
        data = b"" if out is None else json.dumps(out).encode()
        h.send_response(status)
        if status == 429:
            h.send_header("Retry-After", "0")
        if out is not None:
            h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        # The caller may be gone: a watchdog deleting its own instance dies with it.
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            h.wfile.write(data)

    def route(self, method: str, path: str, body: Any, query: dict, auth: str) -> tuple[int, Any]:
        raise NotImplementedError

    # ------------------------------------------------------------------ instances

    def start_instance(self, iid: str, pubkey: str | None, env: dict[str, str], usd: float, gpu: str, label: str,
                       never_ready: bool = False, why_not: str | None = None,
                       start_cmd: list[str] | None = None) -> FakeInstance:
        import tempfile

        marker = "fake-" + secrets.token_hex(6)
        home = Path(tempfile.mkdtemp(prefix="lp-container-"))
        self._homes.append(home)
        env = {**env, "LORAPOD_JOBS_DIR": str(home / "jobs")}
        extra = "SetEnv " + " ".join(f"{k}={v}" for k, v in {**env, "LORAPOD_FAKE_INSTANCE": marker}.items())
        host = None
        if self.host_profile is not None:
            from ..host_profiles import build

            host = build(self.host_profile, Path(tempfile.mkdtemp(prefix="lp-image-")) / "image",
                         {**env, "LORAPOD_FAKE_INSTANCE": marker})  # its "PID 1" carries the marker: killed on delete
            self._hosts.append(host)
            extra = host.sshd_config
        server = self.sshd_factory(extra)
        if pubkey:
            server.authorize(pubkey)
        now = time.time()
        inst = FakeInstance(iid, server, marker, env, usd, gpu, label, never_ready=never_ready,
                            ready_at=now + self.pull_s + self.boot_s, pulled_at=now + self.pull_s, why_not=why_not,
                            start_cmd=start_cmd, home=home, host=host)
        self.instances[iid] = inst
        if start_cmd and not never_ready:  # a container that never starts never runs its command
            self._start_later(inst, max(0.0, (inst.ready_at or now) - now))
        return inst

    def _start_later(self, inst: FakeInstance, after_s: float) -> None:
        t = threading.Timer(after_s, self.run_start_command, [inst])
        t.daemon = True
        t.start()

    def run_start_command(self, inst: FakeInstance) -> None:
        """The container's command, as the container starts (module docstring)."""
        import subprocess

        if inst.deleted or inst.stopped_at is not None or not inst.start_cmd or inst.home is None:
            return
        home = str(inst.home)
        argv = [a.replace("/tmp/.lorapod-init.sh", f"{home}/.lorapod-init.sh").replace("/root/", f"{home}/")
                for a in inst.start_cmd]
        path = inst.host.pid1_path if inst.host is not None else os.environ.get("PATH", "/usr/bin:/bin")
        env = {"PATH": path, "HOME": home, "LANG": "C.UTF-8", **inst.env, "LORAPOD_FAKE_INSTANCE": inst.marker}
        with open(inst.home / "start.log", "ab") as log:
            subprocess.Popen(argv, env=env, cwd=home, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                             start_new_session=True)

    def authorize_later(self, inst: FakeInstance, pubkey: str) -> None:
        """The key reaches the container ``key_delay_s`` after the API accepted it."""
        if self.key_delay_s <= 0:
            inst.sshd.authorize(pubkey)
            return
        t = threading.Timer(self.key_delay_s, lambda: inst.deleted or inst.sshd.authorize(pubkey))
        t.daemon = True
        t.start()

    def kill_instance(self, inst: FakeInstance, by: str) -> None:
        """What destroying a container does: every process in it dies, its disk is gone."""
        inst.deleted = True
        inst.deleted_by = by
        inst.deleted_at = time.time()
        if inst.proxy is not None:
            inst.proxy.close()
        if inst.sshd.proc is not None:  # a stopped container's sshd is down already
            inst.sshd.drop_connections()
        inst.sshd.stop()
        dirs = self._work_dirs(inst) | inst.kept_dirs  # a stopped container's disk goes with it too
        for pid in marked_pids(inst.marker):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        for d in dirs:
            shutil.rmtree(d, ignore_errors=True)

    def _work_dirs(self, inst: FakeInstance) -> set[Path]:
        dirs = set()
        for pid in marked_pids(inst.marker):
            with contextlib.suppress(OSError):
                cwd = Path(os.readlink(f"/proc/{pid}/cwd"))
                if self.work_root in cwd.parents:
                    dirs.add(self.work_root / cwd.relative_to(self.work_root).parts[0])
        return dirs

    def stop_container(self, inst: FakeInstance, grace_s: float, erase_disk: bool) -> None:
        """What a provider stopping a container does (``docker stop``): SIGTERM to every process in
        it, SIGKILL to those still alive ``grace_s`` later; SSH goes down with it. ``erase_disk``:
        its work folders go too (a disk that does not outlive a stop). Called by a test, outside
        the HTTP lock, so the API keeps answering during the grace."""
        dirs = self._work_dirs(inst) if erase_disk else set()
        if not erase_disk:  # its disk stays until the instance is destroyed
            inst.kept_dirs |= self._work_dirs(inst)
        inst.stopped_at = time.time()
        for pid in marked_pids(inst.marker):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGTERM)
                inst.signals.append((pid, "TERM"))
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and marked_pids(inst.marker):
            time.sleep(0.05)
        for pid in marked_pids(inst.marker):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
                inst.signals.append((pid, "KILL"))
        if inst.sshd.proc is not None:  # a stopped container's sshd is down already
            inst.sshd.drop_connections()
        inst.sshd.stop()
        for d in dirs:
            shutil.rmtree(d, ignore_errors=True)

    def start_container(self, inst: FakeInstance) -> None:
        """A stopped container running again on the same disk (its sshd on the same port and keys)."""
        if inst.stopped_at is not None:
            inst.stopped_hours += (time.time() - inst.stopped_at) / 3600
        inst.stopped_at = None
        inst.sshd.start()
        self.run_start_command(inst)  # docker start runs the container's command again

    def live(self) -> list[FakeInstance]:
        return [i for i in self.instances.values() if not i.deleted]

    def running_processes(self) -> list[int]:
        return [p for i in self.instances.values() for p in marked_pids(i.marker)]

    def close(self) -> None:
        for inst in self.live():
            self.kill_instance(inst, "test teardown")
        for host in self._hosts:
            host.stop()
            shutil.rmtree(host.dir.parent, ignore_errors=True)
        for home in self._homes:
            shutil.rmtree(home, ignore_errors=True)
        for inst in self.instances.values():  # a switch's files in the shared /tmp (compute/deadman.py)
            for token in switch_tokens(inst.start_cmd or []):
                for f in Path("/tmp").glob(f".lorapod-switch-{token}.*"):
                    f.unlink(missing_ok=True)
        self.server.shutdown()
        self.server.server_close()


def switch_tokens(argv: list[str]) -> set[str]:
    """The dead man's switches a start command launches (their tokens), in its plain text or in a
    script it carries base64-encoded (RunPod's spot init, compute/remote.py ``spot_init_args``)."""
    import base64

    texts = list(argv)
    for word in argv:
        for b64 in re.findall(r"echo\$\{IFS\}([A-Za-z0-9+/=]+)", word):
            with contextlib.suppress(ValueError):
                texts.append(base64.b64decode(b64).decode(errors="replace"))
    return {t for text in texts for t in re.findall(r"\.lorapod-switch-([0-9a-f]+)", text)}


def marked_pids(marker: str) -> list[int]:
    needle = f"LORAPOD_FAKE_INSTANCE={marker}".encode()
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == os.getpid():
            continue
        try:
            if needle in (d / "environ").read_bytes().split(b"\0"):
                out.append(int(d.name))
        except OSError:
            continue
    return out
