"""Live prices against local fake servers that check each request against the providers' contracts.

The Vast.ai fake validates the request body with the ``searchOffers`` request schema from the
provider's own OpenAPI document (tests/contracts/vast.openapi.yaml, copied from shared/contracts);
the RunPod fake accepts only the GraphQL ``gpuTypes`` fields listed in tests/contracts/README.md.
"""

from __future__ import annotations

import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import jsonschema
import pytest
import yaml

from lorapod.compute.live_prices import live_prices
from lorapod.plan.choose import plan_job
from lorapod.spec import load_spec

HERE = Path(__file__).resolve().parent
EXAMPLES = HERE.parent / "examples"
RUNPOD_KEY = "rpa_" + "k" * 24
VAST_KEY = "v" * 32
RUNPOD_FIELDS = {
    "query", "GpuTypes", "gpuTypes", "id", "displayName", "memoryInGb", "securePrice", "communityPrice",
    "secureSpotPrice", "communitySpotPrice", "lowestPrice", "input", "gpuCount", "minimumBidPrice",
    "uninterruptablePrice",
}


def _vast_schema() -> dict:
    with open(HERE / "contracts" / "vast.openapi.yaml", encoding="utf-8") as fh:
        doc = yaml.load(fh, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    op = doc["paths"]["/api/v0/bundles"]["post"]
    schema = op["requestBody"]["content"]["application/json"]["schema"]
    # erratum C.1 (tests/fakes/vast_fake.py): vast.py sends "on-demand", the enum says "ondemand"
    schema["properties"]["type"]["enum"] = [*schema["properties"]["type"]["enum"], "on-demand"]
    return schema


VAST_SCHEMA = _vast_schema()


class _Fake(BaseHTTPRequestHandler):
    routes: dict = {}
    seen: list = []

    def log_message(self, *args):  # keep pytest output clean
        pass

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        type(self).seen.append((self.path, dict(self.headers), body))
        handler = self.routes.get(self.path.split("?")[0].rstrip("/"))
        if handler is None:
            return self._send(404, {"error": "not_found"})
        status, payload = handler(self.headers, body)
        self._send(status, payload)

    def _send(self, status, payload):
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def runpod_handler(headers, body):
    if headers.get("Authorization") != f"Bearer {RUNPOD_KEY}":
        return 401, {"errors": [{"message": "unauthorized"}]}
    words = set(re.findall(r"[A-Za-z_]+", body.get("query", "")))
    unknown = words - RUNPOD_FIELDS
    if "gpuTypes" not in words or unknown:
        return 400, {"errors": [{"message": f"unknown fields {sorted(unknown)}"}]}
    return 200, {"data": {"gpuTypes": [
        {"id": "NVIDIA GeForce RTX 4090", "displayName": "RTX 4090", "memoryInGb": 24, "securePrice": 0.69,
         "communityPrice": 0.44, "secureSpotPrice": 0.35, "communitySpotPrice": 0.29,
         "lowestPrice": {"minimumBidPrice": 0.29, "uninterruptablePrice": 0.44}},
        {"id": "NVIDIA A100-SXM4-80GB", "displayName": "A100 SXM", "memoryInGb": 80, "securePrice": 1.49,
         "communityPrice": None, "secureSpotPrice": None, "communitySpotPrice": None,
         "lowestPrice": {"minimumBidPrice": None, "uninterruptablePrice": 1.49}},
        {"id": "NVIDIA RTX A6000", "displayName": "RTX A6000", "memoryInGb": 48, "securePrice": 0.49,
         "communityPrice": 0.33, "secureSpotPrice": None, "communitySpotPrice": None,
         "lowestPrice": {"minimumBidPrice": None, "uninterruptablePrice": None}},  # listed, out of stock
        {"id": "AMD Instinct MI300X OAM", "displayName": "MI300X", "memoryInGb": 192, "securePrice": 2.49,
         "communityPrice": None, "secureSpotPrice": None, "communitySpotPrice": None, "lowestPrice": None},
    ]}}


def vast_handler(headers, body):
    if headers.get("Authorization") != f"Bearer {VAST_KEY}":
        return 404, {"error": "unauthorized", "msg": "Invalid user key"}
    try:
        jsonschema.validate(body, VAST_SCHEMA)
    except jsonschema.ValidationError as exc:
        return 400, {"error": "invalid_request", "msg": exc.message}
    if body.get("type") not in ("on-demand", "ondemand", "bid", "reserved"):
        return 400, {"error": "invalid_request", "msg": "type"}
    offers = [
        {"id": 1, "gpu_name": "RTX 4090", "gpu_ram": 24564, "num_gpus": 1, "dph_total": 0.36, "storage_cost": 0.15,
         "inet_down_cost": 0.002, "inet_up_cost": 0.004},
        {"id": 2, "gpu_name": "RTX 4090", "gpu_ram": 24564, "num_gpus": 1, "dph_total": 0.29, "storage_cost": 0.2,
         "inet_down_cost": 0.01, "inet_up_cost": 0.02},
        {"id": 3, "gpu_name": "A100 PCIE", "gpu_ram": 81920, "num_gpus": 1, "dph_total": 0.95, "storage_cost": 0.1},
        {"id": 4, "gpu_name": "A100 PCIE", "gpu_ram": 40960, "num_gpus": 1, "dph_total": 0.55, "storage_cost": 0.1},
    ]
    return 200, {"offers": [o for o in offers if o["gpu_name"] in body["gpu_name"]["in"]]}


@pytest.fixture
def fakes(monkeypatch, tmp_path):
    monkeypatch.setenv("LORAPOD_HOME", str(tmp_path / "home"))
    _Fake.routes = {"/graphql": runpod_handler, "/api/v0/bundles": vast_handler}
    _Fake.seen = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Fake)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    monkeypatch.setenv("LORAPOD_RUNPOD_GRAPHQL_URL", base + "/graphql")
    monkeypatch.setenv("LORAPOD_VAST_URL", base)
    monkeypatch.setenv("RUNPOD_API_KEY", RUNPOD_KEY)
    monkeypatch.setenv("VAST_API_KEY", VAST_KEY)
    yield _Fake
    server.shutdown()
    server.server_close()


def test_live_prices_from_both_providers(fakes):
    got = live_prices(disk_gb=50, timeout_s=5)
    by = {(e.provider, e.gpu, e.tier): e for e in got.entries}
    assert by[("runpod", "RTX 4090", "secure")].usd_per_hour == 0.69
    assert by[("runpod", "RTX 4090", "community")].usd_per_hour == 0.44
    assert by[("runpod", "RTX 4090", "spot")].usd_per_hour == 0.29
    assert by[("runpod", "A100 80GB", "secure")].usd_per_hour == 1.49
    assert not any("MI300" in e.gpu for e in got.entries)
    assert not any(e.gpu == "RTX A6000" for e in got.entries if e.provider == "runpod")  # not in stock
    # Vast.ai: the cheapest offer per GPU, 40 and 80 GB A100s told apart by gpu_ram.
    assert by[("vast", "RTX 4090", "ondemand")].usd_per_hour == 0.29
    assert by[("vast", "RTX 4090", "ondemand")].download_per_gb == 0.01
    assert by[("vast", "A100 80GB", "ondemand")].usd_per_hour == 0.95
    assert by[("vast", "A100 40GB", "ondemand")].usd_per_hour == 0.55
    assert all(e.source == "live" for e in got.entries)
    paths = [p for p, _, _ in fakes.seen]
    assert "/graphql" in paths and "/api/v0/bundles/" in paths
    vast_body = next(b for p, _, b in fakes.seen if p.startswith("/api/v0/bundles"))
    jsonschema.validate(vast_body, VAST_SCHEMA)
    assert vast_body["allocated_storage"] == 50
    # the runner's own query: hosts that can start the default image, reliable, direct SSH
    from lorapod.catalog.images import DEFAULTS
    from lorapod.compute.provider import Requirements
    from lorapod.compute.vast.provider import offer_query

    runner = offer_query(Requirements(disk_gb=50, gpu_count=1), DEFAULTS["vast"], gpu_names=vast_body["gpu_name"]["in"],
                         limit=vast_body["limit"])
    assert vast_body == runner and vast_body["cuda_max_good"] == {"gte": 12.8}
    assert all(h.get("User-Agent", "").startswith("lorapod/") for _, h, _ in fakes.seen)


def test_live_prices_feed_the_ranking(fakes):
    got = live_prices(disk_gb=50, timeout_s=5)
    plan = plan_job(load_spec(EXAMPLES / "sdxl-object-lora.yaml"), images=25, prices=got.entries, gpu="RTX 4090")
    vast = next(o for o in plan.options if o.provider == "vast")
    assert vast.price_source == "live" and vast.usd_per_hour == 0.29
    names = [p.name for p in vast.phases]
    assert any(n.startswith("storage") for n in names) and "bandwidth" in names
    bw = next(p for p in vast.phases if p.name == "bandwidth")
    assert bw.usd == pytest.approx((6.9 + plan.job.upload_gb) * 0.01 + plan.job.pull_gb * 0.02)
    assert not any("host's rate" in w for w in vast.warnings)
    # RunPod's spot price is the spot quote of its RTX 4090 options, not an offer of its own
    assert not any(o.tier == "spot" for o in plan.options)
    secure = next(o for o in plan.options if o.provider == "runpod" and o.tier == "secure")
    assert secure.spot is not None and secure.spot.bid_per_gpu_hour == 0.29


def test_refused_key_falls_back_to_the_snapshot_without_showing_the_key(fakes, monkeypatch):
    monkeypatch.setenv("RUNPOD_API_KEY", "rpa_" + "w" * 24)
    got = live_prices(timeout_s=5)
    assert any("runpod: the API key was refused" in n for n in got.notes)
    assert {e.source for e in got.entries if e.provider == "runpod"} == {"snapshot"}
    assert {e.source for e in got.entries if e.provider == "vast"} == {"live"}
    assert not any("w" * 24 in n for n in got.notes)


def test_no_keys_or_offline_use_the_snapshot(monkeypatch, tmp_path):
    monkeypatch.setenv("LORAPOD_HOME", str(tmp_path))
    monkeypatch.delenv("RUNPOD_API_KEY", raising=False)
    monkeypatch.setenv("VAST_API_KEY", VAST_KEY)
    monkeypatch.setenv("LORAPOD_VAST_URL", "http://127.0.0.1:9")  # discard port: nothing listens
    got = live_prices(timeout_s=2)
    assert any("RUNPOD_API_KEY not set" in n for n in got.notes)
    assert any(n.startswith("vast: live prices unavailable") for n in got.notes)
    assert got.entries and all(e.source == "snapshot" for e in got.entries)
