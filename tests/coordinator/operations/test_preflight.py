"""Preflight (docs/operations.md, "Preflight"): before the first deploy of a configuration
the coordinator checks the C1 copy, a parameter manifest URL and the image in its registry
(a registry on loopback here, speaking the Registry API v2 with an anonymous token), and
refuses with one line, renting nothing, what would fail on every instance."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from vast_manager.coordinator.operations import preflight
from vast_manager.sim.fake_c1 import write_c1

from support.coord_support import make_settings, start
from support.fakes_provider import FakeProvider, offer

MANIFEST = [{"name": "v28-stacked-proof-of-replication.params", "url": "https://x/p",
             "size": 1000, "sha256": "00" * 32}]


@pytest.fixture
async def registry() -> AsyncIterator[str]:
    """A registry with one image, ``example/agent:1.0``, behind an anonymous bearer token;
    it also serves a parameter manifest, a broken one and a 404."""
    async def manifests(request: web.Request) -> web.Response:
        auth = request.headers.get("Authorization")
        if auth != "Bearer anon-token":
            realm = f"http://{request.host}/token"
            return web.Response(status=401, headers={
                "WWW-Authenticate": f'Bearer realm="{realm}",service="registry.test"'})
        found = (request.match_info["repo"], request.match_info["ref"]) == ("example/agent",
                                                                          "1.0")
        return web.Response(status=200 if found else 404)

    async def token(request: web.Request) -> web.Response:
        if request.query.get("scope") == "repository:private/agent:pull":
            return web.Response(status=401)
        return web.json_response({"token": "anon-token"})

    async def manifest(request: web.Request) -> web.Response:
        return web.json_response(MANIFEST)

    async def wrapped(request: web.Request) -> web.Response:
        # The agent's downloader also reads {"files": [...]}, with URLs relative to this one.
        return web.json_response({"files": [{**MANIFEST[0], "url": "p/1"}, {
            **MANIFEST[0], "name": "v28-proof-of-spacetime-fallback.params", "url": "p/2"}]})

    async def broken(request: web.Request) -> web.Response:
        return web.Response(text='[{"name": 1}]')

    async def bad_digest(request: web.Request) -> web.Response:
        return web.json_response([{**MANIFEST[0], "sha256": "abc"}])

    app = web.Application()
    app.router.add_route("HEAD", "/v2/{repo:.+}/manifests/{ref}", manifests)
    app.router.add_get("/token", token)
    app.router.add_get("/manifest.json", manifest)
    app.router.add_get("/broken.json", broken)
    app.router.add_get("/wrapped.json", wrapped)
    app.router.add_get("/bad-digest.json", bad_digest)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    try:
        yield f"127.0.0.1:{server.port}"
    finally:
        await server.close()


def settings(tmp_path: Path, **kw: Any) -> Any:
    return make_settings(tmp_path, **kw)


async def test_every_check_passes_on_a_good_configuration(registry: str, tmp_path: Path) -> None:
    c1 = write_c1(tmp_path / "c1.json")
    checks = await preflight.run(settings(
        tmp_path, preflight_c1=str(c1), vast_image=f"{registry}/example/agent:1.0",
        vast_env=f'{{"VM_PARAMS_MANIFEST": "http://{registry}/manifest.json", '
                 '"VM_WORK_CMD": "/opt/work.sh"}'))
    by_name = {c.name: c for c in checks}
    assert by_name["c1"].ok and "sector 1" in by_name["c1"].detail
    assert by_name["params"].ok and "1 file(s)" in by_name["params"].detail
    assert by_name["image"].ok
    assert by_name["work command"].ok is None
    assert preflight.refusal(checks) is None


@pytest.mark.parametrize(("fields", "name", "says"), [
    ({"preflight_c1": "/nonexistent/c1.json"}, "c1", "C1 file /nonexistent/c1.json cannot"),
    ({"vast_image": "{registry}/example/agent:2.0"}, "image", "is not in its registry"),
    ({"vast_image": "{registry}/private/agent:1.0"}, "image", "refuses an anonymous pull"),
    ({"vast_env": '{{"VM_PARAMS_MANIFEST": "http://{registry}/missing.json"}}'}, "params",
     "answered HTTP 404"),
    ({"vast_env": '{{"VM_PARAMS_MANIFEST": "http://{registry}/broken.json"}}'}, "params",
     "entry 0: 'name' must be a plain file name"),
    ({"vast_env": '{{"VM_PARAMS_MANIFEST": "http://{registry}/bad-digest.json"}}'}, "params",
     "'sha256' must be 64 hex digits"),
])
async def test_a_failed_check_refuses_with_one_line(
    registry: str, tmp_path: Path, fields: dict[str, str], name: str, says: str
) -> None:
    values = {k: v.format(registry=registry) for k, v in fields.items()}
    checks = await preflight.run(settings(tmp_path, **values))
    (failed,) = [c for c in checks if c.ok is False]
    assert failed.name == name and says in failed.detail, failed
    line = preflight.refusal(checks)
    assert line is not None and "\n" not in line and says in line


async def test_a_manifest_the_agent_reads_passes(registry: str, tmp_path: Path) -> None:
    (params,) = [c for c in await preflight.run(settings(
        tmp_path, vast_env=f'{{"VM_PARAMS_MANIFEST": "http://{registry}/wrapped.json"}}'))
        if c.name == "params"]
    assert params.ok and "2 file(s)" in params.detail, params


async def test_what_cannot_be_checked_is_said_and_refuses_nothing(tmp_path: Path) -> None:
    checks = await preflight.run(settings(
        tmp_path, vast_image="ghcr.io/you/agent:1.0", preflight_registry=False,
        vast_env='{"VM_PARAMS_CMD": "curio fetch-params 32"}'))
    assert all(c.ok is None for c in checks), checks
    assert "VM_PREFLIGHT_C1" in checks[0].detail and "curio" in checks[1].detail
    assert preflight.refusal(checks) is None


def test_image_names_as_docker_reads_them() -> None:
    assert preflight.parse_image("ubuntu") == ("registry-1.docker.io", "library/ubuntu",
                                               "latest")
    assert preflight.parse_image("ghcr.io/you/vast-agent:1.0") == ("ghcr.io", "you/vast-agent",
                                                                   "1.0")
    assert preflight.parse_image("localhost:5000/a/b@sha256:ab") == ("localhost:5000", "a/b",
                                                                      "sha256:ab")


async def test_the_first_deploy_of_a_configuration_is_preflighted(
    aiohttp_client: Any, tmp_path: Path
) -> None:
    c1 = tmp_path / "c1.json"
    provider = FakeProvider([offer(9001, 4242, dph_total=0.4)])
    h = await start(aiohttp_client, tmp_path, provider=provider, preflight_c1=str(c1))
    before = h.store.count_rows()
    status, data = await h.admin("POST", "/api/deploy", {"offer_id": 9001})
    assert (status, data["error"]) == (409, "preflight_failed"), data
    assert str(c1) in data["message"] and "\n" not in data["message"]
    assert provider.created == [] and h.store.count_rows() == before
    status, report = await h.admin("POST", "/api/preflight", {})
    assert status == 200 and report["ok"] is False
    write_c1(c1)  # fixed: a new configuration, checked again, passes
    status, data = await h.admin("POST", "/api/deploy", {"offer_id": 9001})
    assert status == 200, data
    assert len(provider.created) == 1
