"""``vm-sim-cuzk-bench``: the simulated ``cuzk-bench``, a client of ``vm-sim-cuzk``.

It stands in for ``cuzk-bench`` at Curio ``e0294b0f`` (docs/cuzk.md): the same
global ``--addr``/``--log-level`` before the subcommand, the same subcommands
and flags, refused as clap refuses them (`vast_manager.sim.cuzk_cli`), and the same
output. ``batch`` reads the C1 file before printing anything, prints its
header, then runs one Prove RPC per proof: with ``-j 1`` one after the
other, each line printed as its proof returns; with ``-j N`` it submits
while a semaphore of N permits allows, and prints the lines only once the
last proof is submitted, in submission order, each after the earlier ones
have returned, as the real tool does; ``CANCELLED``/``TIMEOUT``/``UNKNOWN``
are labels it can print too. A failed RPC ends the run with ``Error: ...``
and exit status 1, no summary.

It talks to the simulated daemon over the simulator's private HTTP/JSON
transport on the daemon's ``listen`` address (documented in
`vast_manager.sim.daemon`), where the real one speaks gRPC. Reported times are
simulated seconds (what a real host would print); the run itself takes
simulated / ``VM_SIM_TIME_SCALE`` real seconds.
"""

from __future__ import annotations

import asyncio
import base64
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from vast_manager.sim import clap
from vast_manager.sim.cuzk_cli import CUZK_BENCH, FEATURE_GATED

CONNECT_TIMEOUT_S = 10.0
# cuzk-bench/src/main.rs status_label
STATUS_LABELS = {1: "COMPLETED", 2: "FAILED", 3: "CANCELLED", 4: "TIMEOUT"}
# main.rs proof_kind_from_str
PROOF_KINDS = {
    "porep": "porep-c2", "porep-c2": "porep-c2", "seal-commit": "porep-c2",
    "snap": "snap-update", "snap-deals": "snap-update", "update": "snap-update",
    "wpost": "window-post", "window-post": "window-post", "windowpost": "window-post",
    "winning": "winning-post", "winning-post": "winning-post", "winningpost": "winning-post",
}


class BenchError(Exception):
    """What anyhow prints for an error returned from main: ``Error: ...``, exit status 1."""

    def __init__(self, message: str, cause: str | None = None) -> None:
        super().__init__(message)
        self.cause = cause

    def render(self) -> str:
        text = f"Error: {self}\n"
        if self.cause:
            text += f"\nCaused by:\n    {self.cause}\n"
        return text


def status_label(status: int) -> str:
    return STATUS_LABELS.get(status, "UNKNOWN")


def _out(line: str = "") -> None:
    # Flushed line by line: a reader sees each line as it is printed.
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


@asynccontextmanager
async def _session(addr: str) -> AsyncIterator[tuple[aiohttp.ClientSession, str]]:
    """A client session and base URL for ``--addr`` (``http://h:p`` or ``unix://``)."""
    timeout = aiohttp.ClientTimeout(total=None, connect=CONNECT_TIMEOUT_S, sock_read=None)
    connector: aiohttp.BaseConnector
    if addr.startswith("unix://"):
        connector = aiohttp.UnixConnector(path=addr[len("unix://") :])
        base = "http://localhost"
    elif "://" in addr:
        connector = aiohttp.TCPConnector()
        base = addr.rstrip("/")
    else:
        # tonic's Endpoint::from_shared needs a URI with a scheme.
        raise BenchError(f"invalid daemon address: {addr}", "invalid format")
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        yield session, base


async def _rpc(addr: str, method: str, path: str, what: str,
               body: dict[str, Any] | None = None) -> Any:
    try:
        async with (
            _session(addr) as (session, base),
            session.request(
                method, base + path, data=orjson.dumps(body) if body is not None else None
            ) as resp,
        ):
            raw = await resp.read()
            if resp.status >= 400:
                raise BenchError(f"{what} RPC failed", _status_text(raw, resp.status))
            if resp.content_type == "application/json":
                return orjson.loads(raw)
            return raw.decode()
    except aiohttp.ClientConnectorError as exc:
        raise BenchError(f"failed to connect to daemon at {addr}", str(exc)) from exc
    except aiohttp.ClientError as exc:
        raise BenchError(f"{what} RPC failed", f"transport error: {exc}") from exc


def _status_text(raw: bytes, status: int) -> str:
    try:
        body = orjson.loads(raw)
        code = str(body.get("error") or "unknown").replace("_", " ").title().replace(" ", "")
        return f'status: {code}, message: "{body.get("message")}"'
    except (orjson.JSONDecodeError, AttributeError):
        return f"status: Unknown, message: \"HTTP {status}\""


def _read_input(proof_type: str, c1: str | None, vanilla: str | None) -> tuple[str, bytes]:
    """main.rs build_proof_params: the proof kind, and the C1 bytes read before anything runs."""
    kind = PROOF_KINDS.get(proof_type.lower())
    if kind is None:
        raise BenchError(f"unknown proof type: {proof_type}. Use: porep, snap, wpost, winning")
    if kind != "porep-c2":
        if not vanilla:
            raise BenchError("--vanilla required for PoSt/SnapDeals proof types")
        raise BenchError(f"(simulated) proof type {proof_type} is not simulated (porep only)")
    if not c1:
        raise BenchError("--c1 required for PoRep proof type")
    try:
        return kind, Path(c1).read_bytes()
    except OSError as exc:
        raise BenchError(f"failed to read {c1}",
                         f"{exc.strerror} (os error {exc.errno})") from exc


def _proof_line(i: int, count: int, resp: dict[str, Any], elapsed_s: float) -> str:
    return (
        f"  [{i}/{count}] {status_label(int(resp['status']))} \u2014 {elapsed_s:.1f}s "
        f"(prove={int(resp['gpu_compute_ms'])} ms, queue={int(resp['queue_wait_ms'])} ms)"
    )


def format_summary(total_s: float, completed: list[tuple[dict[str, Any], float]],
                   failed: int) -> list[str]:
    """The ``=== Batch Summary ===`` block, as the real tool prints it."""
    lines = [
        "",
        "=== Batch Summary ===",
        f"total time:    {total_s:.1f}s",
        f"completed:     {len(completed)}",
        f"failed:        {failed}",
    ]
    if completed:
        walls = [w for _, w in completed]
        proves = [int(r["gpu_compute_ms"]) / 1000.0 for r, _ in completed]
        lines.append(
            f"wall time:     avg={sum(walls) / len(walls):.1f}s "
            f"min={min(walls):.1f}s max={max(walls):.1f}s"
        )
        lines.append(
            f"prove time:    avg={sum(proves) / len(proves):.1f}s "
            f"min={min(proves):.1f}s max={max(proves):.1f}s"
        )
        per_min = len(completed) / total_s * 60.0 if total_s > 0 else float("inf")
        per_proof = total_s / len(completed)
        lines.append(f"throughput:    {per_min:.3f} proofs/min ({per_proof:.1f}s/proof)")
    return lines


async def _sim_now(addr: str) -> float:
    health = await _rpc(addr, "GET", "/sim/v1/health", "Health")
    return float(health["sim_time_s"])


async def _prove(addr: str, kind: str, c1_b64: str, sector_num: int,
                 miner_id: int) -> tuple[dict[str, Any], float]:
    """One Prove RPC; returns its response and its wall time in simulated seconds."""
    started = await _sim_now(addr)  # connect, as the real tool does per request
    resp = await _rpc(addr, "POST", "/sim/v1/prove", "Prove", {
        "proof_kind": kind, "c1_b64": c1_b64, "sector_num": sector_num, "miner_id": miner_id,
    })
    return resp, float(resp["finished_sim_s"]) - started


async def cmd_batch(addr: str, v: dict[str, Any]) -> int:
    kind, c1 = _read_input(v["proof_type"], v["c1"], v["vanilla"])
    count, concurrency = int(v["count"]), int(v["concurrency"])
    _out("=== Batch Benchmark ===")
    _out(f"proof type:  {v['proof_type']}")
    _out(f"count:       {count}")
    _out(f"concurrency: {concurrency}")
    _out()
    c1_b64 = base64.b64encode(c1).decode()
    args = (addr, kind, c1_b64, int(v["sector_num"]), int(v["miner_id"]))
    batch_start = await _sim_now(addr) if count else 0.0
    results: list[tuple[dict[str, Any], float]] = []
    if concurrency <= 1:
        for i in range(count):
            resp, elapsed = await _prove(*args)
            _out(_proof_line(i + 1, count, resp, elapsed))
            results.append((resp, elapsed))
    else:
        sem = asyncio.Semaphore(concurrency)

        async def one() -> tuple[dict[str, Any], float]:
            try:
                return await _prove(*args)
            finally:
                sem.release()

        handles: list[asyncio.Task[tuple[dict[str, Any], float]]] = []
        try:
            for _ in range(count):
                await sem.acquire()
                handles.append(asyncio.create_task(one()))
            for i, handle in enumerate(handles):
                resp, elapsed = await handle
                _out(_proof_line(i + 1, count, resp, elapsed))
                results.append((resp, elapsed))
        finally:
            for h in handles:
                h.cancel()
    batch_end = (max(float(r["finished_sim_s"]) for r, _ in results) if results
                 else batch_start)
    completed = [(r, w) for r, w in results if int(r["status"]) == 1]
    for line in format_summary(batch_end - batch_start, completed, len(results) - len(completed)):
        _out(line)
    return 0


async def cmd_single(addr: str, v: dict[str, Any]) -> int:
    kind, c1 = _read_input(v["proof_type"], v["c1"], v["vanilla"])
    resp, elapsed = await _prove(addr, kind, base64.b64encode(c1).decode(),
                                 int(v["sector_num"]), int(v["miner_id"]))
    _out()
    _out("=== Proof Result ===")
    _out(f"status:    {status_label(int(resp['status']))}")
    _out(f"job_id:    {resp['job_id']}")
    if int(resp["status"]) == 1:
        _out(
            f"timings:   total={resp['total_ms']} ms (queue={resp['queue_wait_ms']} ms, "
            f"srs={resp['srs_load_ms']} ms, synth={resp['synthesis_ms']} ms, "
            f"gpu={resp['gpu_compute_ms']} ms)"
        )
        _out(f"wall time: {round(elapsed * 1000)} ms")
        proof = bytes.fromhex(resp["proof_hex"])
        shown = proof.hex() if len(proof) <= 256 else proof[:128].hex() + "..."
        _out(f"proof:     {len(proof)} bytes (hex: {shown})")
    else:
        _out(f"error:     {resp['error_message']}")
    return 0


async def cmd_status(addr: str) -> int:
    st = await _rpc(addr, "GET", "/sim/v1/status", "GetStatus")
    _out("=== cuzk daemon status ===")
    _out(f"uptime:           {st['uptime_seconds']}s")
    _out(f"proofs completed: {st['total_proofs_completed']}")
    _out(f"proofs failed:    {st['total_proofs_failed']}")
    _out(f"pinned memory:    {st['pinned_memory_bytes']} / {st['pinned_memory_limit_bytes']} bytes")
    if st["gpus"]:
        _out("\nGPUs:")
        for g in st["gpus"]:
            job = (
                f"proving {g['current_proof_kind']} ({g['current_job_id'][:8]})"
                if g["current_job_id"]
                else "idle"
            )
            _out(
                f"  [{g['ordinal']}] {g['name']} \u2014 {g['vram_free_bytes'] // (1024 * 1024)} MiB"
                f" / {g['vram_total_bytes'] // (1024 * 1024)} MiB VRAM \u2014 {job}"
            )
    if st["loaded_srs"]:
        _out("\nLoaded SRS:")
        for s in st["loaded_srs"]:
            _out(
                f"  {s['circuit_id']} (tier={s['tier']}, size={s['size_bytes']} bytes, "
                f"refs={s['ref_count']})"
            )
    if st["queues"]:
        _out("\nQueues:")
        for q in st["queues"]:
            _out(f"  {q['proof_kind']}: pending={q['pending']}, in_progress={q['in_progress']}")
    return 0


async def cmd_preload(addr: str, circuit_id: str) -> int:
    res = await _rpc(addr, "POST", "/sim/v1/preload", "PreloadSRS", {"circuit_id": circuit_id})
    if res["already_loaded"]:
        _out(f"{circuit_id} already loaded")
    else:
        _out(f"{circuit_id} loaded in {res['load_time_ms']} ms")
    return 0


async def cmd_metrics(addr: str) -> int:
    text = await _rpc(addr, "GET", "/sim/v1/metrics", "GetMetrics")
    sys.stdout.write(str(text))
    sys.stdout.flush()
    return 0


async def _dispatch(matches: clap.Matches) -> int:
    addr = str(matches.values["addr"])
    sub = matches.subcommand
    assert sub is not None  # clap requires one
    name, v = sub.command.name, sub.values
    if name in FEATURE_GATED:
        raise BenchError(f"{name} subcommand requires the '{FEATURE_GATED[name]}' feature.")
    if name == "batch":
        return await cmd_batch(addr, v)
    if name == "single":
        return await cmd_single(addr, v)
    if name == "status":
        return await cmd_status(addr)
    if name == "preload":
        return await cmd_preload(addr, str(v["circuit_id"]))
    return await cmd_metrics(addr)


def main(argv: list[str] | None = None) -> int:
    matches = clap.parse_or_exit(CUZK_BENCH, [sys.argv[0], *(sys.argv[1:] if argv is None
                                                             else argv)])
    try:
        return asyncio.run(_dispatch(matches))
    except BenchError as exc:
        sys.stdout.flush()
        sys.stderr.write(exc.render())
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
