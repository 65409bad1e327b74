"""The dashboard's ASGI app (Starlette) and how ``lorapod ui`` serves it (uvicorn).

Pages are rendered on the server with Jinja2 (autoescaping on: captions, prompts, model names
and logs are text, never markup); the live parts are server-sent events (:mod:`lorapod.ui.streams`).
The routes are split by concern: HTML pages (:mod:`lorapod.ui.pages`, what they show assembled in
:mod:`lorapod.ui.views`), the two streams, and the data and actions the pages fetch
(:mod:`lorapod.ui.api`). The :class:`~lorapod.ui.views.Dashboard` travels on ``app.state.dash``.
"""

from __future__ import annotations

import socket
from pathlib import Path

from starlette.applications import Starlette
from starlette.responses import Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from lorapod.errors import LorapodError
from lorapod.ui import api, pages, streams
from lorapod.ui.guard import Guard
from lorapod.ui.views import Dashboard

STATIC = Path(__file__).parent / "static"


def build_app(dash: Dashboard, hosts: set[str], port: int) -> Guard:
    routes = [
        Route("/", pages.runs_page),
        Route("/favicon.ico", lambda request: Response(status_code=204)),
        Route("/stream/runs", streams.runs_stream),
        Route("/runs/{job}", pages.run_page),
        Route("/runs/{job}/metrics", api.run_metrics),
        Route("/runs/{job}/stream", streams.run_stream),
        Route("/runs/{job}/file/{path:path}", api.run_file),
        Route("/runs/{job}/{action}", api.run_action, methods=["POST"]),
        Route("/compare", pages.compare_page),
        Route("/plan", pages.plan_page),
        Route("/data", pages.data_page),
        Route("/data/report/{n}", pages.data_report),
        Mount("/static", StaticFiles(directory=STATIC, follow_symlink=False), name="static"),
    ]
    app = Starlette(routes=routes)
    app.state.dash = dash
    return Guard(app, dash.token, hosts, port, dash.prefix)


def allowed_hosts(host: str, port: int) -> set[str]:
    names = {host}
    if host in ("127.0.0.1", "localhost"):
        names |= {"127.0.0.1", "localhost"}
    return {f"{n}:{port}" for n in names} | ({f"[{host}]:{port}"} if ":" in host else set())


def open_socket(host: str, port: int) -> socket.socket:
    """The listening socket, bound before uvicorn starts, so that ``--port 0`` gives a free port
    whose number goes into the printed address and the Host check."""
    fam = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(fam, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise LorapodError(f"cannot listen on {host}:{port} ({exc.strerror})",
                           hint="pick another port with --port N (0 = any free one)") from exc
    sock.listen(64)
    return sock


def serve_forever(dash: Dashboard, sock: socket.socket) -> None:
    """Run uvicorn on ``sock`` until Ctrl-C; open streams get two seconds to close."""
    import uvicorn

    host, port = sock.getsockname()[:2]
    app = build_app(dash, allowed_hosts(host, port), port)
    config = uvicorn.Config(app, log_level="warning", access_log=False, timeout_graceful_shutdown=2,
                            lifespan="off")
    uvicorn.Server(config).run(sockets=[sock])
