"""Raw HTTP to Vast.ai. Nothing else in lorapod talks to Vast.ai.

Contract: ``tests/contracts/vast.openapi.yaml``. Paths are sent with the trailing slash that
Vast's own CLI uses (``/api/v0/bundles/``); the document lists them without it. Base URL:
``LORAPOD_VAST_URL`` overrides ``https://console.vast.ai``.
"""

from __future__ import annotations

import os
from typing import Any

from lorapod.compute.httpapi import HttpApi, api_key, user_agent

BASE_URL = "https://console.vast.ai"


class VastApi(HttpApi):
    provider = "vast"

    def __init__(self, key: str | None = None, base_url: str | None = None, **kw: Any) -> None:
        super().__init__(base_url or os.environ.get("LORAPOD_VAST_URL") or BASE_URL,
                         key or api_key("VAST_API_KEY", "vast"), **kw)

    def search_offers(self, query: dict[str, Any]) -> list[dict[str, Any]]:
        """``POST /api/v0/bundles/`` (search offers; 200 -> {offers: [...]})."""
        body = self.request("POST", "/api/v0/bundles/", json_body=query).json()
        offers = body.get("offers") or []
        return offers if isinstance(offers, list) else [offers]

    def create_instance(self, ask_id: int, body: dict[str, Any]) -> int:
        """``PUT /api/v0/asks/{id}/`` (create instance; 200 -> {success, new_contract})."""
        resp = self.request("PUT", f"/api/v0/asks/{ask_id}/", json_body=body, idempotent=False)
        data = resp.json()
        if not data.get("success") or not data.get("new_contract"):
            raise self.error(resp, "PUT", f"/api/v0/asks/{ask_id}/")
        return int(data["new_contract"])

    def change_bid(self, instance_id: int, price: float) -> None:
        """``PUT /api/v0/instances/bid_price/{id}/`` (change bid; vast.py ``change__bid`` sends
        ``{"client_id": "me", "price": ...}``): an interruptible instance's bid per machine, $/h."""
        self.request("PUT", f"/api/v0/instances/bid_price/{instance_id}/",
                     json_body={"client_id": "me", "price": round(float(price), 4)})

    def attach_ssh_key(self, instance_id: int, public_key: str) -> None:
        """``POST /api/v0/instances/{id}/ssh/`` (attach ssh-key)."""
        self.request("POST", f"/api/v0/instances/{instance_id}/ssh/", json_body={"ssh_key": public_key})

    def show_instance(self, instance_id: int) -> dict[str, Any] | None:
        """``GET /api/v0/instances/{id}/`` (showInstance; 200 -> {instances: Instance}). None when
        gone: ``200 {"instances": null}`` is how Vast answers for an instance that no longer exists
        (vast.py ``show__instance``), 404 in case it ever says so."""
        resp = self.request("GET", f"/api/v0/instances/{instance_id}/", allow=(404,))
        if resp.status_code == 404:
            return None
        body = resp.json()
        row = body.get("instances") if isinstance(body, dict) else None
        return row if isinstance(row, dict) and row else None

    def destroy_instance(self, instance_id: int) -> None:
        """``DELETE /api/v0/instances/{id}/`` (destroyInstance; 200). Already gone (404) is success.
        A 200 whose body says ``success: false`` did nothing (vast.py ``destroy_instance`` prints
        ``rj["msg"]`` then): raised, so the caller retries instead of believing it."""
        path = f"/api/v0/instances/{instance_id}/"
        resp = self.request("DELETE", path, allow=(404,))
        if resp.status_code == 404:
            return
        try:
            body = resp.json()
        except ValueError:
            body = None
        if not (isinstance(body, dict) and body.get("success") is True):
            err = self.error(resp, "DELETE", path)
            err.message = f"vast did not destroy instance {instance_id}: {err.message}"
            raise err

    def self_destroy_recipe(self, instance_id: str) -> dict[str, Any]:
        """How the watchdog destroys its own instance with the scoped ``CONTAINER_API_KEY``
        ("can only start, stop, or destroy that specific instance", api-reference/hello-world.mdx),
        as data the standard-library watchdog interprets: DELETE must answer ``success: true``
        (vast.py ``destroy_instance``: a 200 with ``success: false`` did nothing), then a second
        DELETE must find no such instance (404) before the watchdog believes it. Why not the GET
        vast.py's ``show instance`` sends: the scoped key may only start, stop or destroy, so a
        read with it is not documented to work; "gone" is what destroy itself can tell. The
        controller's own confirm is the account key's GET (compute/teardown.py)."""
        url = f"{self.base_url}/api/v0/instances/{{CONTAINER_ID}}/"
        return {
            "steps": [{"name": "DELETE", "kind": "http", "method": "DELETE", "url": url, "token": "CONTAINER_API_KEY",
                       "done_status": [200], "done_json": {"success": True}, "gone_status": [404]}],
            "confirm": {"name": "DELETE again", "kind": "http", "method": "DELETE", "url": url,
                        "token": "CONTAINER_API_KEY", "gone_status": [404]},
            "ids": {"CONTAINER_ID": instance_id},
            "user_agent": user_agent("lorapod-watchdog"),
        }

    def list_instances(self) -> list[dict[str, Any]]:
        """``GET /api/v1/instances/`` (show instances; keyset pages of at most 25)."""
        out: list[dict[str, Any]] = []
        token: str | None = None
        for _ in range(400):
            params: dict[str, Any] = {"limit": 25}
            if token:
                params["after_token"] = token
            body = self.request("GET", "/api/v1/instances/", params=params).json()
            out += body.get("instances") or []
            token = body.get("next_token")
            if not token:
                break
        return out
