"""Preflight: before the first deploy of a configuration (the image, the C1 input, the
parameter source, the work command), check what the coordinator can, and refuse with one
line what would fail on every instance (docs/operations.md, "Preflight").

- the C1: ``VM_PREFLIGHT_C1``, a copy on the coordinator of the file the instances read,
  checked as the agent checks it (``agent.c1.check_c1``: as cuzk reads it);
- the parameter source: a ``VM_PARAMS_MANIFEST`` URL in ``VM_VAST_ENV`` is fetched and
  read as the agent's downloader reads it (``agent.params.parse_manifest``);
  a path or a ``VM_PARAMS_CMD`` runs on the instance and is not checked (said so);
- the image: ``VM_VAST_IMAGE`` looked up in its registry (the Docker Registry HTTP API
  v2: ``HEAD /v2/NAME/manifests/REFERENCE``, with the anonymous pull token a ``401``'s
  ``WWW-Authenticate: Bearer`` names), where the registry answers anonymously; with a
  login (``VM_VAST_IMAGE_LOGIN``) or an unreachable registry it is not checked (said so).

A check that cannot run is ``None`` (not checked), never a refusal; a refusal is a
check that ran and failed.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from vast_manager.agent.c1 import C1Error, check_c1
from vast_manager.agent.params import ManifestError, parse_manifest
from vast_manager.coordinator.settings import Settings

TIMEOUT_S = 15.0
MANIFEST_BYTES = 1024 * 1024
_ACCEPT = ", ".join((
    "application/vnd.oci.image.index.v1+json", "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
    "application/vnd.docker.distribution.manifest.v2+json"))
_CHALLENGE = re.compile(r'(\w+)="([^"]*)"')


@dataclass(frozen=True, slots=True)
class Check:
    name: str  # c1, params, image, work command
    ok: bool | None  # None: not checked (and why is in ``detail``)
    detail: str

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "ok": self.ok, "detail": self.detail}


def extra_env(settings: Settings) -> dict[str, Any]:
    """``VM_VAST_ENV`` as a dict ({} when unset or not an object: serve refuses that)."""
    try:
        value = orjson.loads(settings.vast_env) if settings.vast_env else {}
    except orjson.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}


def fingerprint(settings: Settings) -> str:
    """What makes a configuration: the image, the instances' environment, the onstart
    script and the C1 copy (its path, size and time)."""
    c1 = settings.preflight_c1
    stamp = ""
    if c1:
        try:
            st = Path(c1).stat()
            stamp = f"{st.st_size}:{st.st_mtime_ns}"
        except OSError:
            stamp = "missing"
    text = "\n".join(str(x) for x in (settings.vast_image, settings.vast_env,
                                      settings.vast_onstart, c1, stamp))
    return hashlib.sha256(text.encode()).hexdigest()


def check_c1_copy(settings: Settings) -> Check:
    if not settings.preflight_c1:
        return Check("c1", None, "not checked: VM_PREFLIGHT_C1 (a copy of the instances' "
                                 "C1 file) is unset")
    try:
        c1 = check_c1(Path(settings.preflight_c1))
    except C1Error as err:
        return Check("c1", False, str(err))
    return Check("c1", True, f"C1 file {c1.path}: sector {c1.sector_num}, "
                             f"{c1.registered_proof}, {c1.size_bytes} bytes")


async def check_params(settings: Settings, http: aiohttp.ClientSession) -> Check:
    env = extra_env(settings)
    manifest = env.get("VM_PARAMS_MANIFEST")
    command = env.get("VM_PARAMS_CMD")
    if command:
        return Check("params", None, f"not checked: VM_PARAMS_CMD ({str(command)[:80]}) runs "
                                     "on the instance; its program must be in the image")
    if not manifest:
        return Check("params", None, "not checked: no VM_PARAMS_MANIFEST or VM_PARAMS_CMD in "
                                     "VM_VAST_ENV (the parameters must be in the image)")
    url = str(manifest)
    if not url.startswith(("http://", "https://")):
        return Check("params", None, f"not checked: VM_PARAMS_MANIFEST {url[:120]} is a path "
                                     "on the instance")
    try:
        async with http.get(url) as resp:
            if resp.status != 200:
                return Check("params", False, f"VM_PARAMS_MANIFEST {url} answered HTTP "
                                              f"{resp.status}")
            body = await resp.content.read(MANIFEST_BYTES + 1)
    except (TimeoutError, aiohttp.ClientError) as err:
        return Check("params", False, f"VM_PARAMS_MANIFEST {url} cannot be fetched: "
                                      f"{str(err) or type(err).__name__}")
    return _read_manifest(url, body)


def _read_manifest(url: str, body: bytes) -> Check:
    if len(body) > MANIFEST_BYTES:
        return Check("params", False, f"VM_PARAMS_MANIFEST {url} is larger than "
                                      f"{MANIFEST_BYTES} bytes")
    try:
        entries = parse_manifest(body, base_url=url)
    except ManifestError as err:
        return Check("params", False, f"VM_PARAMS_MANIFEST {url}: {err}")
    if not entries:
        return Check("params", False, f"VM_PARAMS_MANIFEST {url} lists no file")
    total = sum(e.size for e in entries)
    return Check("params", True, f"VM_PARAMS_MANIFEST {url}: {len(entries)} file(s), "
                                 f"{total / 1e9:.1f} GB")


def parse_image(image: str) -> tuple[str, str, str]:
    """(registry host, repository, tag or digest) of an image name, as docker reads it: a
    first part with a dot, a colon or ``localhost`` is the registry (else Docker Hub)."""
    name, ref = image, "latest"
    if "@" in name:
        name, ref = name.split("@", 1)
    elif ":" in name.rsplit("/", 1)[-1]:
        name, ref = name.rsplit(":", 1)
    first, _, rest = name.partition("/")
    if rest and ("." in first or ":" in first or first == "localhost"):
        host, repo = first, rest
    else:
        host, repo = "registry-1.docker.io", name if "/" in name else f"library/{name}"
    return host, repo, ref


async def check_image(settings: Settings, http: aiohttp.ClientSession) -> Check:
    image = settings.vast_image
    if not image:
        return Check("image", None, "not checked: no VM_VAST_IMAGE (not a vast.ai fleet)")
    if not settings.preflight_registry:
        return Check("image", None, f"not checked: {image} (VM_PREFLIGHT_REGISTRY=false)")
    if settings.vast_image_login:
        return Check("image", None, f"not checked: {image} is private (VM_VAST_IMAGE_LOGIN)")
    host, repo, ref = parse_image(image)
    loopback = host.split(":")[0] in ("127.0.0.1", "localhost")
    url = f"{'http' if loopback else 'https'}://{host}/v2/{repo}/manifests/{ref}"
    try:
        status = await _head_manifest(http, url, repo)
    except (TimeoutError, aiohttp.ClientError, ValueError) as err:
        return Check("image", None, f"not checked: the registry {host} cannot be reached "
                                    f"from the coordinator ({str(err) or type(err).__name__})")
    if status == 200:
        return Check("image", True, f"{image} is in its registry")
    if status == 404:
        return Check("image", False, f"{image} is not in its registry ({host} has no "
                                     f"{repo}:{ref}): vast.ai cannot pull it")
    if status in (401, 403):
        return Check("image", False, f"{host} refuses an anonymous pull of {repo} and "
                                     "VM_VAST_IMAGE_LOGIN is unset: vast.ai cannot pull it")
    return Check("image", None, f"not checked: {host} answered HTTP {status}")


async def _head_manifest(http: aiohttp.ClientSession, url: str, repo: str) -> int:
    headers = {"Accept": _ACCEPT}
    async with http.head(url, headers=headers) as resp:
        if resp.status != 401:
            return resp.status
        challenge = resp.headers.get("WWW-Authenticate", "")
    if not challenge.lower().startswith("bearer "):
        return 401
    params = dict(_CHALLENGE.findall(challenge))
    realm = params.pop("realm", None)
    if not realm:
        return 401
    params.setdefault("scope", f"repository:{repo}:pull")
    async with http.get(realm, params=params) as resp:
        if resp.status != 200:
            return 401
        token = (await resp.json(content_type=None) or {})
    bearer = token.get("token") or token.get("access_token") if isinstance(token, dict) else None
    if not bearer:
        return 401
    async with http.head(url, headers={**headers, "Authorization": f"Bearer {bearer}"}) as resp:
        return resp.status


async def run(settings: Settings) -> list[Check]:
    """Every check, in order: the C1, the parameter source, the image, the work command."""
    timeout = aiohttp.ClientTimeout(total=TIMEOUT_S)
    async with aiohttp.ClientSession(timeout=timeout) as http:
        c1 = await asyncio.to_thread(check_c1_copy, settings)
        params = await check_params(settings, http)
        image = await check_image(settings, http)
    work = extra_env(settings).get("VM_WORK_CMD")
    return [c1, params, image,
            Check("work command", None, "not checked: it runs on the instance"
                  if work else "no VM_WORK_CMD: kept instances will idle (and be stopped)")]


def refusal(checks: list[Check]) -> str | None:
    """The one line a deploy is refused with, or None when nothing failed."""
    failed = [c for c in checks if c.ok is False]
    if not failed:
        return None
    return ("Preflight refused the deploy: " + "; ".join(f"{c.name}: {c.detail}" for c in failed)
            + " (vast-manager preflight shows every check).")
