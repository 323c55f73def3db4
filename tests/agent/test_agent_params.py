"""Parameter fetch: the built-in downloader (resume, verify, bad hash) and VM_PARAMS_CMD."""

from __future__ import annotations

import contextlib
import hashlib
import sys
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web

from vast_manager.agent.params import (
    MAX_MANIFEST_BYTES,
    VERIFIED_RECORD,
    ChecksumMismatch,
    Downloader,
    InsufficientDisk,
    ManifestEntry,
    ManifestError,
    ParamsError,
    load_manifest,
    parse_manifest,
    run_params_cmd,
)

DATA = {
    "v28-a.params": bytes(range(256)) * 400,  # 102400 bytes
    "v28-a.vk": b"verifying key" * 10,
}


class FileServer:
    def __init__(self, honour_range: bool = True, corrupt: bool = False) -> None:
        self.honour_range = honour_range
        self.corrupt = corrupt
        self.requests: list[tuple[str, str | None]] = []

    async def handle(self, request: web.Request) -> web.StreamResponse:
        name = request.match_info["name"]
        rng = request.headers.get("Range")
        self.requests.append((name, rng))
        data = DATA[name]
        if self.corrupt:
            data = b"\xff" + data[1:]
        if rng and self.honour_range:
            start = int(rng.removeprefix("bytes=").split("-")[0])
            if start >= len(data):
                return web.Response(status=416)
            return web.Response(
                status=206,
                body=data[start:],
                headers={"Content-Range": f"bytes {start}-{len(data) - 1}/*"},
            )
        return web.Response(body=data)

    async def manifest(self, request: web.Request) -> web.Response:
        return web.json_response(
            [
                {
                    "name": n,
                    "url": f"files/{n}",
                    "size": len(d),
                    "sha256": hashlib.sha256(d).hexdigest(),
                }
                for n, d in DATA.items()
            ]
        )

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/files/{name}", self.handle)
        app.router.add_get("/manifest.json", self.manifest)
        return app


async def no_sleep(_s: float) -> None:
    return None


def entries(base: str) -> list[ManifestEntry]:
    return [
        ManifestEntry(n, f"{base}/files/{n}", len(d), hashlib.sha256(d).hexdigest())
        for n, d in DATA.items()
    ]


async def start(aiohttp_server: Any, fs: FileServer) -> str:
    server = await aiohttp_server(fs.app())
    return str(server.make_url("")).rstrip("/")


async def test_fetch_verifies_reports_bytes_and_skips_next_time(
    aiohttp_server: Any, tmp_path: Path
) -> None:
    fs = FileServer()
    base = await start(aiohttp_server, fs)
    progress: list[tuple[int, int]] = []
    async with aiohttp.ClientSession() as session:
        dl = Downloader(tmp_path, session, sleep=no_sleep)
        await dl.fetch(entries(base), on_progress=lambda d, t: progress.append((d, t)))
        for name, data in DATA.items():
            assert (tmp_path / name).read_bytes() == data
            assert not (tmp_path / (name + ".part")).exists()
        total = sum(len(d) for d in DATA.values())
        assert progress[-1] == (total, total)
        assert all(t == total for _, t in progress)
        assert [d for d, _ in progress] == sorted(d for d, _ in progress)
        assert (tmp_path / VERIFIED_RECORD).exists()
        n = len(fs.requests)
        await Downloader(tmp_path, session, sleep=no_sleep).fetch(entries(base))
        assert len(fs.requests) == n  # present and verified: nothing fetched


async def test_resume_uses_range_into_part_file(aiohttp_server: Any, tmp_path: Path) -> None:
    fs = FileServer()
    base = await start(aiohttp_server, fs)
    data = DATA["v28-a.params"]
    (tmp_path / "v28-a.params.part").write_bytes(data[:30000])
    async with aiohttp.ClientSession() as session:
        await Downloader(tmp_path, session, sleep=no_sleep).fetch(entries(base)[:1])
    assert fs.requests == [("v28-a.params", "bytes=30000-")]
    assert (tmp_path / "v28-a.params").read_bytes() == data


async def test_server_ignoring_range_restarts_cleanly(aiohttp_server: Any, tmp_path: Path) -> None:
    fs = FileServer(honour_range=False)
    base = await start(aiohttp_server, fs)
    data = DATA["v28-a.params"]
    (tmp_path / "v28-a.params.part").write_bytes(data[:5000])
    async with aiohttp.ClientSession() as session:
        await Downloader(tmp_path, session, sleep=no_sleep).fetch(entries(base)[:1])
    assert (tmp_path / "v28-a.params").read_bytes() == data


async def test_bad_hash_is_refused(aiohttp_server: Any, tmp_path: Path) -> None:
    fs = FileServer(corrupt=True)
    base = await start(aiohttp_server, fs)
    async with aiohttp.ClientSession() as session:
        with pytest.raises(ChecksumMismatch):
            await Downloader(tmp_path, session, attempts=2, sleep=no_sleep).fetch(entries(base)[:1])
    assert not (tmp_path / "v28-a.params").exists()
    assert not (tmp_path / "v28-a.params.part").exists()
    assert len(fs.requests) == 2  # retried once from scratch, then gave up


async def test_present_file_with_wrong_content_is_fetched_again(
    aiohttp_server: Any, tmp_path: Path
) -> None:
    fs = FileServer()
    base = await start(aiohttp_server, fs)
    vk = DATA["v28-a.vk"]
    (tmp_path / "v28-a.vk").write_bytes(b"X" * len(vk))
    async with aiohttp.ClientSession() as session:
        await Downloader(tmp_path, session, sleep=no_sleep).fetch(entries(base)[1:])
    assert (tmp_path / "v28-a.vk").read_bytes() == vk
    assert len(fs.requests) == 1


async def test_free_disk_is_checked_first(aiohttp_server: Any, tmp_path: Path) -> None:
    fs = FileServer()
    base = await start(aiohttp_server, fs)
    async with aiohttp.ClientSession() as session:
        dl = Downloader(tmp_path, session, disk_free=lambda p: 10_000, sleep=no_sleep)
        with pytest.raises(InsufficientDisk):
            await dl.fetch(entries(base))
    assert fs.requests == []


async def test_manifest_from_url_resolves_relative_urls(
    aiohttp_server: Any, tmp_path: Path
) -> None:
    fs = FileServer()
    base = await start(aiohttp_server, fs)
    async with aiohttp.ClientSession() as session:
        got = await load_manifest(f"{base}/manifest.json", session)
        assert [e.url for e in got] == [f"{base}/files/{n}" for n in DATA]
        path = tmp_path / "m.json"
        path.write_bytes(
            orjson.dumps(
                [{"name": e.name, "url": e.url, "size": e.size, "sha256": e.sha256} for e in got]
            )
        )
        assert await load_manifest(str(path), session) == got


@pytest.mark.parametrize(
    "item",
    [
        {"name": "../etc/passwd", "url": "http://x/a", "size": 1, "sha256": "0" * 64},
        {"name": ".hidden", "url": "http://x/a", "size": 1, "sha256": "0" * 64},
        {"name": "a", "url": "file:///etc/passwd", "size": 1, "sha256": "0" * 64},
        {"name": "a", "url": "http://x/a", "size": -1, "sha256": "0" * 64},
        {"name": "a", "url": "http://x/a", "size": 1, "sha256": "xyz"},
    ],
)
def test_bad_manifest_entries_are_refused(item: dict[str, Any]) -> None:
    with pytest.raises(ManifestError):
        parse_manifest(orjson.dumps([item]))


async def test_params_cmd_reports_bytes_and_fails_on_nonzero(tmp_path: Path) -> None:
    lines: list[tuple[str, str]] = []
    progress: list[tuple[int, int]] = []
    script = (
        f'{sys.executable} -c "import os; '
        "open(os.path.join(os.environ['FIL_PROOFS_PARAMETER_CACHE'], 'x.params'), 'wb')"
        ".write(b'0' * 1000); print('fetched')\""
    )
    await run_params_cmd(
        script,
        tmp_path / "p",
        sink=lambda s, t: lines.append((s, t)),
        total_bytes=1000,
        on_progress=lambda d, t: progress.append((d, t)),
        poll_s=0.05,
    )
    assert ("params", "fetched") in lines
    assert progress[-1] == (1000, 1000)
    with pytest.raises(ParamsError):
        await run_params_cmd("exit 3", tmp_path / "p", sink=lambda s, t: None)


async def test_an_oversized_manifest_is_refused_unread(
    aiohttp_server: Any, tmp_path: Path
) -> None:
    """A manifest server that streams without end (no length given), one that declares a
    huge length, and a huge file are each refused with one error, not read whole."""
    sent: list[int] = []

    async def endless(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse()
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        chunk = b"[" + b" " * 65_535
        with contextlib.suppress(ConnectionError):
            for _ in range(10_000):  # 640 MiB if nothing stopped it
                await resp.write(chunk)
                sent.append(len(chunk))
        return resp

    async def declared(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse()
        resp.content_length = 1 << 40
        await resp.prepare(request)
        with contextlib.suppress(ConnectionError):
            await resp.write(b"[")
        return resp

    app = web.Application()
    app.router.add_get("/endless.json", endless)
    app.router.add_get("/declared.json", declared)
    server = await aiohttp_server(app)
    base = str(server.make_url("")).rstrip("/")
    path = tmp_path / "big.json"
    path.write_bytes(b"[" + b" " * MAX_MANIFEST_BYTES + b"]")
    async with aiohttp.ClientSession() as session:
        for source in (f"{base}/endless.json", f"{base}/declared.json", str(path)):
            with pytest.raises(ManifestError, match="over 1,048,576 bytes"):
                await load_manifest(source, session)
    assert sum(sent) < 64 * MAX_MANIFEST_BYTES
