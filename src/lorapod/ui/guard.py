"""The dashboard's door: a random token on every request, a same-origin check on every change.

``lorapod ui`` prints ``http://127.0.0.1:PORT/PREFIX/?token=T``. The first request with the token
gets a cookie holding it (HttpOnly, SameSite=Strict, named after the port so two dashboards do not
mix) and is redirected to the same address without it, so the token leaves the address bar, the
history and any Referer.

Browsers scope cookies by host and path, never by port (RFC 6265 section 8.5, "Cookies do not
provide isolation by port"; Chromium 156 sends a ``127.0.0.1`` cookie, ``__Host-`` and ``Secure``
ones included, to every port of 127.0.0.1, which tests/test_ui_browser.py checks). So the cookie
is scoped by path instead: every page lives under a random PREFIX, chosen when the dashboard
starts, and the cookie is set with ``Path=/PREFIX/``. Another server on 127.0.0.1 (another user's,
another program's) is sent it only for a request under that prefix, which it cannot know: the
prefix is in no page another origin can read, and never in a Referer (``no-referrer``). Every later request must carry the cookie (or an ``X-Lorapod-Token``
header); anything else is 403. A request whose ``Host`` is not the address the server was
started on is 403 too (a DNS-rebinding page would send its own name). State changes are POST
with the token in ``X-Lorapod-Token`` and an ``Origin`` equal to this server's own: another
site's page can neither read the token nor send that header without a CORS preflight, which is
never answered.

Every response carries a Content-Security-Policy that allows this server's own scripts only
(no inline script), so text from a run folder that escaped somewhere still could not run.
"""

from __future__ import annotations

import html
import secrets
from urllib.parse import urlencode

from starlette.datastructures import URL, Headers, QueryParams
from starlette.requests import HTTPConnection
from starlette.responses import HTMLResponse, PlainTextResponse, RedirectResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

TOKEN_HEADER = "x-lorapod-token"
CSP = ("default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
       "media-src 'self'; connect-src 'self'; frame-src 'self'; frame-ancestors 'self'; base-uri 'none'; "
       "form-action 'self'; object-src 'none'")
SAFE_METHODS = ("GET", "HEAD")


def new_token() -> str:
    return secrets.token_urlsafe(24)


def new_prefix() -> str:
    """A path no other server can guess: the dashboard's pages, and its cookie, live under it."""
    return "/" + secrets.token_urlsafe(12)


def cookie_name(port: int) -> str:
    return f"lorapod_ui_{port}"


class Guard:
    """ASGI middleware: token, Host and Origin checks, and the security headers."""

    def __init__(self, app: ASGIApp, token: str, hosts: set[str], port: int, prefix: str = "") -> None:
        self.app = app
        self.token = token
        self.hosts = hosts  # "127.0.0.1:8765", "localhost:8765", ...
        self.port = port
        self.cookie = cookie_name(port)
        self.prefix = prefix.rstrip("/")  # "" (tests) or "/<random>": where the pages and the cookie live

    def _ok(self, value: str | None) -> bool:
        return bool(value) and secrets.compare_digest(str(value).encode(), self.token.encode())

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        conn = HTTPConnection(scope)
        headers = Headers(scope=scope)
        host = headers.get("host", "")
        method = scope["method"]
        if host not in self.hosts:
            await PlainTextResponse("403: unknown Host", 403)(scope, receive, send)
            return
        path = scope.get("path", "")
        inside = bool(self.prefix) and (path == self.prefix or path.startswith(self.prefix + "/"))
        if inside:  # the app's routes see the path without the prefix (ASGI root_path)
            scope = {**scope, "root_path": scope.get("root_path", "") + self.prefix}
        query = QueryParams(scope.get("query_string", b""))
        if method in SAFE_METHODS and "token" in query:
            if not self._ok(query.get("token")):
                await PlainTextResponse("403: wrong token; use the address `lorapod ui` printed", 403)(
                    scope, receive, send)
                return
            rest = [(k, v) for k, v in query.multi_items() if k != "token"]
            url = URL(scope=scope).replace(query=urlencode(rest))
            dest = url.path if inside or not self.prefix else self.prefix + "/"
            dest += f"?{url.query}" if url.query else ""
            if headers.get("sec-fetch-site") == "cross-site":
                # reached from another site or a file (`lorapod ui --open`): a redirect would stay in
                # that cross-site navigation, which a SameSite=Strict cookie is not sent with, so the
                # page moves on by itself, a same-site navigation that carries it
                target = html.escape(dest, quote=True)
                resp = HTMLResponse(f'<!doctype html><meta http-equiv="refresh" content="0;url={target}">'
                                    f'<title>lorapod ui</title><a href="{target}">lorapod ui</a>',
                                    headers={"referrer-policy": "no-referrer", "cache-control": "no-store"})
            else:
                resp = RedirectResponse(dest, 303)
            resp.set_cookie(self.cookie, self.token, httponly=True, samesite="strict", path=self.prefix + "/")
            await resp(scope, receive, send)
            return
        if not (self._ok(conn.cookies.get(self.cookie)) or self._ok(headers.get(TOKEN_HEADER))):
            await PlainTextResponse("403: no token; open the address `lorapod ui` printed", 403)(scope, receive, send)
            return
        if method not in SAFE_METHODS:
            origin = headers.get("origin")
            if not self._ok(headers.get(TOKEN_HEADER)) or origin != f"http://{host}":
                await PlainTextResponse("403: changes need this page's token and origin", 403)(scope, receive, send)
                return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                raw = list(message.get("headers", []))
                raw += [(b"content-security-policy", CSP.encode()), (b"x-content-type-options", b"nosniff"),
                        (b"referrer-policy", b"no-referrer"), (b"x-frame-options", b"SAMEORIGIN"),
                        (b"cache-control", b"no-store")]
                message = {**message, "headers": raw}
            await send(message)

        await self.app(scope, receive, send_with_headers)
