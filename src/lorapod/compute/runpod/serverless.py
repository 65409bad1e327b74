"""RunPod Serverless over REST v1: templates and endpoints, nothing else.

Contract: ``tests/contracts/runpod-rest-v1.openapi.json``: CreateTemplate (``TemplateCreateInput``
{name, imageName, isServerless, env, containerDiskInGb, volumeInGb} -> ``Template``), CreateEndpoint
(``EndpointCreateInput`` {templateId, name, gpuTypeIds, gpuCount, workersMin, workersMax,
idleTimeout, ...} -> ``Endpoint``), GetEndpoint, DeleteEndpoint / DeleteTemplate (204). A template's
name must be unique on the account (the ``Template.name`` description says so).

Creates are sent once (``idempotent=False``): an answer that never came may still have made the
template or endpoint, so the caller is told to look (``lorapod ps``, the console) rather than
making a second one. Deletes may be repeated: a second delete of something gone changes nothing.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from lorapod.compute.httpapi import ApiError
from lorapod.compute.runpod.api import RunPodApi
from lorapod.errors import LorapodError

CONSOLE = "https://www.runpod.io/console/serverless"
#: What an id of RunPod's looks like in a URL path: one segment, never "..", "/" or "?". Checked
#: before any request, so a bogus ``--endpoint ../templates/ID`` never becomes ``DELETE /templates/ID``.
_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")


def checked_id(value: str, what: str = "endpoint") -> str:
    """``value`` when it can be a RunPod {what} id; else a LorapodError, before any request."""
    if not isinstance(value, str) or not _ID.fullmatch(value):
        raise LorapodError(f"{str(value)[:80]!r} is not a RunPod {what} id",
                           hint="`lorapod ps` lists the endpoints lorapod created, with their ids")
    return value


class CreateUncertain(LorapodError):
    """A create whose answer was lost (a timeout, a 5xx, a dropped connection): it may have
    happened. The caller looks it up by its name before anything else."""


@dataclass(frozen=True)
class Endpoint:
    id: str
    name: str
    template_id: str
    workers_min: int
    workers_max: int
    gpu_type_ids: tuple[str, ...]


def _str(raw: dict[str, Any], key: str, limit: int = 191) -> str:
    v = raw.get(key)
    return v[:limit] if isinstance(v, str) else ""


def _endpoint(raw: Any) -> Endpoint:
    if not isinstance(raw, dict) or not isinstance(raw.get("id"), str):
        raise LorapodError(f"RunPod sent an endpoint lorapod cannot read: {str(raw)[:200]}", hint=f"check {CONSOLE}")
    gpus = raw["gpuTypeIds"] if isinstance(raw.get("gpuTypeIds"), list) else []
    return Endpoint(raw["id"][:64], _str(raw, "name"), _str(raw, "templateId", 64),
                    int(raw.get("workersMin") or 0), int(raw.get("workersMax") or 0),
                    tuple(str(g)[:64] for g in gpus[:32]))


class Serverless:
    def __init__(self, api: RunPodApi | None = None) -> None:
        self.api = api or RunPodApi()

    def _create(self, path: str, body: dict[str, Any], what: str) -> dict[str, Any]:
        try:
            out = self.api.request("POST", path, json_body=body, ok=(200, 201), idempotent=False).json()
        except ApiError as exc:
            if exc.uncertain:
                raise CreateUncertain(f"RunPod may have created the {what} {body.get('name')!r} but its answer "
                                      "was lost", hint=f"`lorapod ps` shows it; `lorapod down --orphans` looks it "
                                                       f"up by its name (or see {CONSOLE})") from exc
            raise
        if not isinstance(out, dict) or not isinstance(out.get("id"), str):
            raise LorapodError(f"RunPod answered the {what} create without an id: {str(out)[:200]}", hint=f"check {CONSOLE}")
        return out

    def create_template(self, body: dict[str, Any]) -> str:
        """``POST /templates`` once; the template's id."""
        return self._create("/templates", body, "template")["id"][:64]

    def create_endpoint(self, body: dict[str, Any]) -> Endpoint:
        """``POST /endpoints`` once."""
        return _endpoint(self._create("/endpoints", body, "endpoint"))

    def list_endpoints(self) -> list[Endpoint]:
        """``GET /endpoints`` (ListEndpoints: an array of ``Endpoint``): every endpoint on the
        account, how one whose create never answered is found by its name."""
        out = self.api.request("GET", "/endpoints").json()
        if not isinstance(out, list):
            raise LorapodError(f"RunPod listed endpoints as something lorapod cannot read: {str(out)[:200]}",
                               hint=f"check {CONSOLE}")
        return [_endpoint(e) for e in out[:10000] if isinstance(e, dict) and isinstance(e.get("id"), str)]

    def get_endpoint(self, endpoint_id: str) -> Endpoint | None:
        """``GET /endpoints/{id}``; None when RunPod has no such endpoint (404, or 400 for an id it
        no longer knows, as its pods answer)."""
        checked_id(endpoint_id)
        resp = self.api.request("GET", f"/endpoints/{endpoint_id}", allow=(400, 404))
        return None if resp.status_code in (400, 404) else _endpoint(resp.json())

    def delete_endpoint(self, endpoint_id: str) -> bool:
        """``DELETE /endpoints/{id}``; True when RunPod confirmed, False when it was already gone."""
        checked_id(endpoint_id)
        resp = self.api.request("DELETE", f"/endpoints/{endpoint_id}", ok=(200, 204), allow=(400, 404))
        if resp.status_code in (400, 404):
            if self.get_endpoint(endpoint_id) is not None:
                raise self.api.error(resp, "DELETE", f"/endpoints/{endpoint_id}")
            return False
        return True

    def delete_template(self, template_id: str) -> bool:
        """``DELETE /templates/{id}``; True when RunPod confirmed, False when it was already gone
        (or refused, e.g. still in use: nothing bills for a template)."""
        checked_id(template_id, "template")
        resp = self.api.request("DELETE", f"/templates/{template_id}", ok=(200, 204), allow=(400, 404))
        return resp.status_code not in (400, 404)
