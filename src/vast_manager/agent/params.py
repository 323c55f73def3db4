"""Proof parameter fetch: ``VM_PARAMS_CMD`` or the built-in resumable, verifying downloader.

The built-in downloader reads a manifest (a JSON list of ``{name, url, size,
sha256}``, from a path or a URL), checks free disk first, downloads into
``<name>.part`` resuming with HTTP Range, verifies SHA-256, renames, and
remembers what it verified so a restart does not hash 45 GiB again. A failed
try is tried again under the one retry policy (``vast_manager.common.retry``),
resuming where the part file ends.
Progress is reported in bytes.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import re
import shlex
import shutil
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urljoin, urlsplit

import aiohttp
import orjson

from vast_manager.agent.procs import LineSink, ManagedProcess
from vast_manager.common.retry import Backoff, retrying

log = logging.getLogger(__name__)

ProgressFn = Callable[[int, int], None]  # (done_bytes, total_bytes)
CHUNK_BYTES = 4 * 1024 * 1024
DISK_MARGIN_BYTES = 1024 * 1024 * 1024  # left free beyond the files themselves
VERIFIED_RECORD = ".vast-agent-verified.json"
#: The largest manifest read: Curio's parameter set is a few dozen entries of ~200 bytes,
#: so a manifest past this is not one, and reading it whole could exhaust the agent.
MAX_MANIFEST_BYTES = 1024 * 1024
_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


class ParamsError(Exception):
    """Parameters could not be fetched."""


class ManifestError(ParamsError):
    """The manifest is missing or malformed."""


class InsufficientDisk(ParamsError):
    """Not enough free disk for the files still to fetch."""


class ChecksumMismatch(ParamsError):
    """A downloaded file's SHA-256 is not the manifest's."""


@dataclass(frozen=True, slots=True)
class ManifestEntry:
    name: str
    url: str
    size: int
    sha256: str


def parse_manifest(data: bytes, base_url: str | None = None) -> list[ManifestEntry]:
    """Parse a manifest; relative URLs resolve against ``base_url`` (a URL manifest's own)."""
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise ManifestError(f"manifest is not JSON: {exc}") from None
    if isinstance(obj, dict) and isinstance(obj.get("files"), list):
        obj = obj["files"]
    if not isinstance(obj, list):
        raise ManifestError("manifest must be a JSON list of {name, url, size, sha256}")
    entries: list[ManifestEntry] = []
    seen: set[str] = set()
    for i, item in enumerate(obj):
        if not isinstance(item, dict):
            raise ManifestError(f"manifest entry {i} is not an object")
        name, url, size, digest = (item.get(k) for k in ("name", "url", "size", "sha256"))
        # The name becomes a file name in the params folder: no paths, no dot files.
        if not isinstance(name, str) or not _NAME_RE.fullmatch(name) or name.endswith(".part"):
            raise ManifestError(f"manifest entry {i}: 'name' must be a plain file name")
        if name in seen:
            raise ManifestError(f"manifest entry {i}: duplicate name {name!r}")
        seen.add(name)
        if not isinstance(url, str) or not url:
            raise ManifestError(f"manifest entry {i} ({name}): 'url' must be a string")
        if base_url is not None:
            url = urljoin(base_url, url)
        if urlsplit(url).scheme not in ("http", "https"):
            raise ManifestError(f"manifest entry {i} ({name}): 'url' must be http(s)")
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise ManifestError(f"manifest entry {i} ({name}): 'size' must be a byte count")
        if not isinstance(digest, str) or not re.fullmatch(r"[0-9a-fA-F]{64}", digest):
            raise ManifestError(f"manifest entry {i} ({name}): 'sha256' must be 64 hex digits")
        entries.append(ManifestEntry(name, url, size, digest.lower()))
    return entries


async def load_manifest(source: str, session: aiohttp.ClientSession) -> list[ManifestEntry]:
    """Read the manifest from a path or an http(s) URL."""
    if urlsplit(source).scheme in ("http", "https"):
        try:
            async with session.get(source) as resp:
                if resp.status != 200:
                    raise ManifestError(f"manifest URL answered {resp.status}")
                data = await _read_at_most(resp, MAX_MANIFEST_BYTES)
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise ManifestError(f"manifest URL failed: {type(exc).__name__}") from exc
        return parse_manifest(data, base_url=source)
    try:
        with open(source, "rb") as fh:
            data = fh.read(MAX_MANIFEST_BYTES + 1)
    except OSError as exc:
        raise ManifestError(f"cannot read manifest {source}: {exc.strerror}") from None
    if len(data) > MAX_MANIFEST_BYTES:
        raise ManifestError(_too_large(source))
    return parse_manifest(data)


def _too_large(source: str) -> str:
    return f"manifest {source} is over {MAX_MANIFEST_BYTES:,} bytes; refused"


async def _read_at_most(resp: aiohttp.ClientResponse, limit: int) -> bytes:
    """The body, refused on its declared length or once more than ``limit`` bytes came."""
    if resp.content_length is not None and resp.content_length > limit:
        raise ManifestError(_too_large(str(resp.url)))
    chunks: list[bytes] = []
    size = 0
    async for chunk in resp.content.iter_chunked(64 * 1024):
        size += len(chunk)
        if size > limit:
            raise ManifestError(_too_large(str(resp.url)))
        chunks.append(chunk)
    return b"".join(chunks)


def _sha256_of(path: Path) -> hashlib._Hash:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(CHUNK_BYTES):
            h.update(chunk)
    return h


class Downloader:
    """The built-in downloader for one params folder."""

    def __init__(
        self,
        dest_dir: Path,
        session: aiohttp.ClientSession,
        *,
        disk_free: Callable[[Path], int] | None = None,
        attempts: int = 5,
        retry_base_s: float = 2.0,
        sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
    ) -> None:
        self.dest_dir = dest_dir
        self._session = session
        self._disk_free = disk_free or (lambda p: shutil.disk_usage(p).free)
        self.attempts = attempts
        self._backoff = Backoff(base_s=retry_base_s, cap_s=60.0)
        self._sleep = sleep

    # -- the record of verified files ------------------------------------------

    def _record_path(self) -> Path:
        return self.dest_dir / VERIFIED_RECORD

    def _load_record(self) -> dict[str, Any]:
        try:
            obj = orjson.loads(self._record_path().read_bytes())
        except (OSError, orjson.JSONDecodeError):
            return {}
        return obj if isinstance(obj, dict) else {}

    def _remember(self, entry: ManifestEntry, path: Path) -> None:
        record = self._load_record()
        st = path.stat()
        record[entry.name] = {
            "size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": entry.sha256
        }
        tmp = self._record_path().with_suffix(".tmp")
        tmp.write_bytes(orjson.dumps(record))
        os.replace(tmp, self._record_path())

    def _known_good(self, entry: ManifestEntry, path: Path) -> bool:
        try:
            st = path.stat()
        except FileNotFoundError:
            return False
        if st.st_size != entry.size:
            return False
        rec = self._load_record().get(entry.name)
        return (
            isinstance(rec, dict)
            and rec.get("size") == st.st_size
            and rec.get("mtime_ns") == st.st_mtime_ns
            and rec.get("sha256") == entry.sha256
        )

    # -- fetching --------------------------------------------------------------

    async def fetch(
        self, entries: list[ManifestEntry], on_progress: ProgressFn | None = None
    ) -> None:
        """Fetch every entry not already present and verified."""
        self.dest_dir.mkdir(parents=True, exist_ok=True)
        total = sum(e.size for e in entries)
        done = 0
        todo: list[ManifestEntry] = []
        for entry in entries:
            final = self.dest_dir / entry.name
            if self._known_good(entry, final):
                done += entry.size
                continue
            if final.exists() and final.stat().st_size == entry.size:
                # Present but not verified by us (e.g. fetched by another tool): check it.
                digest = (await asyncio.to_thread(_sha256_of, final)).hexdigest()
                if digest == entry.sha256:
                    self._remember(entry, final)
                    done += entry.size
                    continue
                log.warning("%s is present but its SHA-256 differs: fetching it again", entry.name)
            todo.append(entry)
        needed = 0
        for entry in todo:
            part = self.dest_dir / (entry.name + ".part")
            have = part.stat().st_size if part.exists() else 0
            needed += max(entry.size - have, 0)
        free = self._disk_free(self.dest_dir)
        if needed + DISK_MARGIN_BYTES > free:
            raise InsufficientDisk(
                f"need {needed} bytes (+{DISK_MARGIN_BYTES} margin) in {self.dest_dir}, "
                f"{free} free"
            )
        if on_progress is not None:
            on_progress(done, total)
        for entry in todo:
            base = done

            def progress(got: int, base: int = base) -> None:
                if on_progress is not None:
                    on_progress(base + got, total)

            await self._fetch_one(entry, progress)
            done += entry.size
        if on_progress is not None:
            on_progress(done, total)

    async def _fetch_one(self, entry: ManifestEntry, progress: Callable[[int], None]) -> None:
        final = self.dest_dir / entry.name
        part = self.dest_dir / (entry.name + ".part")
        attempts = retrying(
            self._backoff,
            retry_on=_worth_another_try,
            attempts=self.attempts,
            sleep=self._sleep,
            log=log,
            what=entry.name,
        )
        try:
            async for attempt in attempts:
                with attempt:
                    await self._download(entry, part, progress)
                    digest = (await asyncio.to_thread(_sha256_of, part)).hexdigest()
                    if digest != entry.sha256:
                        part.unlink(missing_ok=True)  # the next try starts afresh
                        raise ChecksumMismatch(
                            f"{entry.name}: SHA-256 {digest} is not the manifest's {entry.sha256}"
                        )
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise ParamsError(
                f"{entry.name}: download failed {self.attempts} times: {type(exc).__name__}"
            ) from exc
        os.replace(part, final)
        self._remember(entry, final)
        log.info("fetched and verified %s (%d bytes)", entry.name, entry.size)

    async def _download(
        self, entry: ManifestEntry, part: Path, progress: Callable[[int], None]
    ) -> None:
        have = part.stat().st_size if part.exists() else 0
        if have > entry.size:
            part.unlink()
            have = 0
        if have == entry.size:
            progress(have)
            return
        headers = {"Range": f"bytes={have}-"} if have else {}
        async with self._session.get(entry.url, headers=headers) as resp:
            if resp.status == 416:
                # Nothing beyond what we have: let the hash decide.
                progress(have)
                return
            if resp.status == 200:
                # The server ignored the range: start over.
                have = 0
                mode = "wb"
            elif resp.status == 206 and have:
                mode = "ab"
            else:
                host = urlsplit(entry.url).netloc
                raise ParamsError(f"{entry.name}: {host} answered {resp.status}")
            progress(have)
            with open(part, mode) as fh:
                async for chunk in resp.content.iter_chunked(CHUNK_BYTES):
                    fh.write(chunk)
                    have += len(chunk)
                    if have > entry.size:
                        raise ChecksumMismatch(
                            f"{entry.name}: server sent more than {entry.size} bytes"
                        )
                    progress(have)
                fh.flush()
                os.fsync(fh.fileno())
        if have < entry.size:
            raise ParamsError(f"{entry.name}: download ended at {have} of {entry.size} bytes")


def _worth_another_try(exc: BaseException) -> bool:
    """A dropped or slow connection, an answer or a file that was wrong this time; not a
    full disk (waiting does not free it)."""
    return isinstance(exc, TimeoutError | aiohttp.ClientError | ParamsError) and not isinstance(
        exc, InsufficientDisk
    )


def dir_bytes(path: Path) -> int:
    """Bytes of regular files under ``path`` (the progress of an external fetch command)."""
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(root, name)).st_size
    return total


async def run_params_cmd(
    command: str,
    params_dir: Path,
    *,
    sink: LineSink,
    total_bytes: int | None = None,
    on_progress: ProgressFn | None = None,
    env: Mapping[str, str] | None = None,
    poll_s: float = 2.0,
) -> None:
    """Run ``VM_PARAMS_CMD`` under a shell; progress is the bytes in ``params_dir``."""
    params_dir.mkdir(parents=True, exist_ok=True)
    child_env = dict(os.environ if env is None else env)
    child_env["FIL_PROOFS_PARAMETER_CACHE"] = str(params_dir)
    proc = ManagedProcess(["/bin/sh", "-c", command], source="params", sink=sink, env=child_env)
    log.info("fetching parameters with: %s", shlex.split(command)[0] if command.strip() else "")
    await proc.start()
    waiter = asyncio.ensure_future(proc.wait())
    try:
        while not waiter.done():
            if on_progress is not None:
                done = await asyncio.to_thread(dir_bytes, params_dir)
                on_progress(done, total_bytes if total_bytes is not None else 0)
            # asyncio.timeout, not wait_for: the latter can swallow a cancellation (3.11).
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(poll_s):
                    await asyncio.shield(waiter)
        code = waiter.result()
    finally:
        if not waiter.done():
            waiter.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await waiter
        await proc.stop()
    if code != 0:
        raise ParamsError(f"VM_PARAMS_CMD exited with status {code}")
    if on_progress is not None:
        done = await asyncio.to_thread(dir_bytes, params_dir)
        on_progress(done, total_bytes if total_bytes is not None else done)
