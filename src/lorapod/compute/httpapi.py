"""HTTP mechanics shared by the providers' ``api.py`` modules: timeouts, retries, clear errors.

Retries: 429 and 5xx (and connection errors) with exponential backoff, honouring
``Retry-After``, up to ``retries`` times; anything else is answered at once. A request that
creates something (``idempotent=False``: RunPod ``POST /pods``, Vast.ai ``PUT /asks``) is
never blindly retried: only a 429 or a connection that was never made is certain to have
created nothing. A timeout or a 5xx after the request was sent raises an :class:`ApiError`
with ``uncertain=True``, and the caller looks the instance up by its label before trying
again (:func:`lorapod.compute.acquire.acquire`). 401/403 become a
:class:`ProviderError` that says to check the key, never showing it. The key lives only in
the ``Authorization`` header of an in-memory client: it is never logged, printed or written.
"""

from __future__ import annotations

import json
import os
import stat
import time
from pathlib import Path
from typing import Any

import httpx

from lorapod.errors import ProviderError
from lorapod.home import lorapod_home


class ApiError(ProviderError):
    """``fatal``: no other offer can help (bad key, no balance), so stop trying offers."""

    def __init__(self, message: str, status: int | None = None, hint: str | None = None,
                 body: Any = None, fatal: bool = False, uncertain: bool = False) -> None:
        super().__init__(message, hint)
        self.status = status
        self.body = body
        self.fatal = fatal
        self.uncertain = uncertain  # a create that may have happened: look it up before retrying


def api_key(env_name: str, provider: str) -> str:
    """The key from the environment, else from ``$LORAPOD_HOME/credentials.json`` (must be 0600)."""
    key = os.environ.get(env_name)
    if key:
        return key.strip()
    path = lorapod_home() / "credentials.json"
    if path.is_file():
        mode = stat.S_IMODE(path.stat().st_mode)
        if mode & 0o077:
            raise ProviderError(f"{path} is readable by others (mode {mode:o}); lorapod will not use it",
                                hint=f"chmod 600 {path}")
        try:
            data = json.loads(path.read_text())
        except ValueError as exc:
            raise ProviderError(f"{path} is not valid JSON") from exc
        if isinstance(data, dict) and data.get(provider):
            return str(data[provider]).strip()
    raise ProviderError(f"no {provider} API key",
                        hint=f"export {env_name}=... or put {{\"{provider}\": \"...\"}} in "
                             f"{path} (chmod 600)")


def save_api_key(provider: str, key: str) -> Path:
    path = lorapod_home() / "credentials.json"
    data = json.loads(path.read_text()) if path.is_file() else {}
    data[provider] = key
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        json.dump(data, fh)
    os.chmod(path, 0o600)
    return path


def user_agent(who: str = "lorapod") -> str:
    """An explicit client name: runpodctl sends ``RunPod-CLI/<version>``, runpod-python its own, and
    an edge that refuses generic clients would refuse ``python-httpx/x`` (review row 20)."""
    from lorapod import __version__

    return f"{who}/{__version__}"


class HttpApi:
    """A JSON API at ``base_url`` with bearer auth, bounded retries and readable errors."""

    provider = "provider"

    def __init__(self, base_url: str, key: str, timeout: float = 30.0, retries: int = 5,
                 backoff_s: float = 1.0, max_backoff_s: float = 30.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.retries = retries
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self._client = httpx.Client(base_url=self.base_url, timeout=timeout,
                                    headers={"Authorization": f"Bearer {key}", "Accept": "application/json",
                                             "User-Agent": user_agent()})

    def __repr__(self) -> str:  # never show the key
        return f"{type(self).__name__}({self.base_url!r})"

    def close(self) -> None:
        self._client.close()

    def request(self, method: str, path: str, *, json_body: Any = None, params: dict | None = None,
                ok: tuple[int, ...] = (200, 201, 202, 204), allow: tuple[int, ...] = (),
                idempotent: bool = True) -> httpx.Response:
        """Send, retrying 429/5xx/connection errors; returns responses in ``ok`` or ``allow``.

        ``idempotent=False``: only a 429 or a connection never made is retried; anything that
        may have reached the server raises ``ApiError(uncertain=True)`` instead."""
        delay = self.backoff_s
        for attempt in range(self.retries + 1):
            try:
                resp = self._client.request(method, path, json=json_body, params=params)
            except httpx.TransportError as exc:
                if not idempotent and not isinstance(exc, httpx.ConnectError):
                    raise ApiError(f"{self.provider} did not answer {method} {path} ({type(exc).__name__}); "
                                   "it may have acted on it", hint="lorapod looks the instance up by its label",
                                   uncertain=True) from exc
                if attempt >= self.retries:
                    raise ApiError(f"{self.provider} API unreachable ({type(exc).__name__}) on {method} {path}",
                                   hint="check your network; the provider may be down") from exc
                time.sleep(delay)
                delay = min(self.max_backoff_s, delay * 2)
                continue
            if resp.status_code in ok or resp.status_code in allow:
                return resp
            if resp.status_code >= 500 and not idempotent:
                err = self.error(resp, method, path)
                err.uncertain = True
                raise err
            if (resp.status_code == 429 or resp.status_code >= 500) and attempt < self.retries:
                wait = delay
                ra = resp.headers.get("Retry-After")
                if ra and ra.replace(".", "", 1).isdigit():
                    wait = min(self.max_backoff_s, float(ra))
                time.sleep(wait)
                delay = min(self.max_backoff_s, delay * 2)
                continue
            raise self.error(resp, method, path)
        raise AssertionError("unreachable")

    def error(self, resp: httpx.Response, method: str, path: str) -> ApiError:
        try:
            body = resp.json()
        except ValueError:
            body = resp.text[:300]
        msg = _message(body)
        where = f"{method} {path}"
        code = resp.status_code
        low = msg.lower()
        if code in (401, 403) and not any(w in low for w in ("balance", "credit", "not your own")):
            return ApiError(f"{self.provider} refused the API key (HTTP {code} on {where})", code,
                            hint=f"check the key ({self.provider.upper()}_API_KEY or credentials.json); "
                                 "it may be revoked or lack permissions", body=body, fatal=True)
        if any(w in low for w in ("balance", "credit", "insufficient funds", "payment")):
            return ApiError(f"{self.provider}: not enough balance ({msg})", code,
                            hint=f"add credit in the {self.provider} console, then run again", body=body,
                            fatal=True)
        if code == 429:
            return ApiError(f"{self.provider} kept rate-limiting {where}", code, hint="wait a minute and retry",
                            body=body)
        if code >= 500:
            return ApiError(f"{self.provider} server error {code} on {where}: {msg}", code,
                            hint="the provider is having trouble; retry later", body=body)
        return ApiError(f"{self.provider} answered HTTP {code} on {where}: {msg}", code, body=body)


def _message(body: Any) -> str:
    if isinstance(body, dict):
        for k in ("msg", "error", "message", "detail"):
            if body.get(k):
                return str(body[k])[:300]
        return json.dumps(body)[:300]
    return str(body)[:300]
