"""``vm-sim-cuzk-bench``: the simulated ``cuzk-bench``, a client of ``vm-sim-cuzk``.

Same global ``--addr`` and subcommands as the real tool (``single``, ``batch``,
``status``, ``preload``, ``metrics``) and the same output, so the agent's
parser cannot tell them apart. It talks to the simulated daemon over the
simulator's private HTTP/JSON transport on the daemon's ``listen`` address
(documented in `agent.sim.daemon`), where the real one speaks gRPC.

Reported times are simulated seconds (what a real host would print); the run
itself takes simulated / ``VM_SIM_TIME_SCALE`` real seconds.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import orjson

DEFAULT_ADDR = "http://127.0.0.1:9820"
CONNECT_TIMEOUT_S = 10.0


class BenchError(Exception):
    """A failure the tool reports as ``Error: ...`` with a non-zero exit."""


def _out(line: str = "") -> None:
    # Flushed line by line: the agent reads each proof as it completes.
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


@asynccontextmanager
async def _session(addr: str) -> AsyncIterator[tuple[aiohttp.ClientSession, str]]:
    """A client session and base URL for ``--addr`` (``http://h:p``, ``h:p`` or ``unix://``)."""
    timeout = aiohttp.ClientTimeout(total=None, connect=CONNECT_TIMEOUT_S, sock_read=None)
    connector: aiohttp.BaseConnector
    if addr.startswith("unix://"):
        connector = aiohttp.UnixConnector(path=addr[len("unix://") :])
        base = "http://localhost"
    else:
        connector = aiohttp.TCPConnector()
        base = addr.rstrip("/") if "://" in addr else f"http://{addr.rstrip('/')}"
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        yield session, base


async def _request(addr: str, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
    try:
        async with (
            _session(addr) as (session, base),
            session.request(
                method, base + path, data=orjson.dumps(body) if body is not None else None
            ) as resp,
        ):
            raw = await resp.read()
            if resp.status >= 400:
                raise BenchError(_error_message(raw, resp.status))
            if resp.content_type == "application/json":
                return orjson.loads(raw)
            return raw.decode()
    except aiohttp.ClientError as exc:
        raise BenchError(f"failed to connect to daemon at {addr}: {exc}") from exc


def _error_message(raw: bytes, status: int) -> str:
    try:
        return str(orjson.loads(raw).get("message") or f"daemon answered {status}")
    except (orjson.JSONDecodeError, AttributeError):
        return f"daemon answered {status}"


def _read_c1(path: str | None) -> int:
    if not path:
        raise BenchError("--c1 is required for porep")
    p = Path(path)
    try:
        return len(p.read_bytes())
    except OSError as exc:
        raise BenchError(f"failed to read {p}: {exc.strerror or exc}") from exc


def _proof_line(ev: dict[str, Any], count: int) -> str:
    return (
        f"  [{ev['index']}/{count}] {ev['status']} \u2014 {float(ev['wall_s']):.1f}s "
        f"(prove={int(ev['prove_ms'])} ms, queue={int(ev['queue_ms'])} ms)"
    )


def format_summary(total_s: float, completed: list[dict[str, Any]], failed: int) -> list[str]:
    """The ``=== Batch Summary ===`` block, as the real tool prints it."""
    lines = [
        "",
        "=== Batch Summary ===",
        f"total time:    {total_s:.1f}s",
        f"completed:     {len(completed)}",
        f"failed:        {failed}",
    ]
    if completed:
        walls = [float(e["wall_s"]) for e in completed]
        proves = [int(e["prove_ms"]) / 1000.0 for e in completed]
        lines.append(
            f"wall time:     avg={sum(walls) / len(walls):.1f}s "
            f"min={min(walls):.1f}s max={max(walls):.1f}s"
        )
        lines.append(
            f"prove time:    avg={sum(proves) / len(proves):.1f}s "
            f"min={min(proves):.1f}s max={max(proves):.1f}s"
        )
        per_min = len(completed) / total_s * 60.0 if total_s > 0 else 0.0
        per_proof = total_s / len(completed)
        lines.append(f"throughput:    {per_min:.3f} proofs/min ({per_proof:.1f}s/proof)")
    return lines


async def cmd_batch(addr: str, proof_type: str, c1: str | None, count: int, conc: int) -> int:
    c1_bytes = _read_c1(c1)
    # Reach the daemon before printing anything, as the real tool connects first.
    await _request(addr, "GET", "/sim/v1/health")
    _out("=== Batch Benchmark ===")
    _out(f"proof type:  {proof_type}")
    _out(f"count:       {count}")
    _out(f"concurrency: {conc}")
    _out()
    completed: list[dict[str, Any]] = []
    failed = 0
    total_s: float | None = None
    body = {"proof_type": proof_type, "count": count, "concurrency": conc, "c1_bytes": c1_bytes}
    try:
        async with (
            _session(addr) as (session, base),
            session.post(base + "/sim/v1/batch", data=orjson.dumps(body)) as resp,
        ):
            if resp.status >= 400:
                raise BenchError(_error_message(await resp.read(), resp.status))
            async for raw in resp.content:
                if not raw.strip():
                    continue
                ev = orjson.loads(raw)
                if ev.get("event") == "proof":
                    _out(_proof_line(ev, count))
                    if ev["status"] == "COMPLETED":
                        completed.append(ev)
                    else:
                        failed += 1
                elif ev.get("event") == "done":
                    total_s = float(ev["total_s"])
    except aiohttp.ClientError as exc:
        raise BenchError(f"lost the daemon at {addr}: {exc}") from exc
    if total_s is None:
        raise BenchError(f"the daemon at {addr} ended the batch early")
    for line in format_summary(total_s, completed, failed):
        _out(line)
    return 0


async def cmd_single(addr: str, proof_type: str, c1: str | None) -> int:
    c1_bytes = _read_c1(c1)
    res = await _request(
        addr, "POST", "/sim/v1/prove", {"proof_type": proof_type, "c1_bytes": c1_bytes}
    )
    _out()
    _out("=== Proof Result ===")
    _out(f"status:    {res['status']}")
    _out(f"job_id:    {res['job_id']}")
    if res["status"] == "COMPLETED":
        _out(
            f"timings:   total={res['total_ms']} ms (queue={res['queue_ms']} ms, "
            f"srs={res['srs_ms']} ms, synth={res['synth_ms']} ms, gpu={res['prove_ms']} ms)"
        )
        _out(f"wall time: {round(float(res['wall_s']) * 1000)} ms")
        proof = bytes.fromhex(res["proof_hex"])
        shown = proof.hex() if len(proof) <= 256 else proof[:128].hex() + "..."
        _out(f"proof:     {len(proof)} bytes (hex: {shown})")
    else:
        _out(f"error:     {res['error']}")
    return 0


async def cmd_status(addr: str) -> int:
    st = await _request(addr, "GET", "/sim/v1/status")
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
    res = await _request(addr, "POST", "/sim/v1/preload", {"circuit_id": circuit_id})
    if res["already_loaded"]:
        _out(f"{circuit_id} already loaded")
    else:
        _out(f"{circuit_id} loaded in {res['load_time_ms']} ms")
    return 0


async def cmd_metrics(addr: str) -> int:
    text = await _request(addr, "GET", "/sim/v1/metrics")
    sys.stdout.write(str(text))
    sys.stdout.flush()
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vm-sim-cuzk-bench",
        description="Simulated cuzk-bench (vast-manager's stand-in; times are simulated).",
    )
    parser.add_argument("-a", "--addr", default=DEFAULT_ADDR, help="daemon address")
    parser.add_argument("--log-level", default="info", help="accepted for compatibility")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, helptext in (("single", "run one proof"), ("batch", "run N proofs")):
        p = sub.add_parser(name, help=helptext)
        p.add_argument("-t", "--type", dest="proof_type", required=True)
        p.add_argument("--c1", default=None, help="C1 output JSON (any file in the simulator)")
        p.add_argument("--vanilla", default=None, help="accepted; PoSt/Snap are not simulated")
        if name == "batch":
            p.add_argument("-n", "--count", type=int, default=3)
            p.add_argument("-j", "--concurrency", type=int, default=1)
    sub.add_parser("status", help="query daemon status")
    pre = sub.add_parser("preload", help="pre-warm SRS parameters")
    pre.add_argument("-c", "--circuit-id", required=True)
    sub.add_parser("metrics", help="Prometheus metrics")
    return parser


async def _dispatch(args: argparse.Namespace) -> int:
    if args.command == "batch":
        if args.count < 0:
            raise BenchError("count must not be negative")
        return await cmd_batch(args.addr, args.proof_type, args.c1, args.count, args.concurrency)
    if args.command == "single":
        return await cmd_single(args.addr, args.proof_type, args.c1)
    if args.command == "status":
        return await cmd_status(args.addr)
    if args.command == "preload":
        return await cmd_preload(args.addr, args.circuit_id)
    return await cmd_metrics(args.addr)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return asyncio.run(_dispatch(args))
    except BenchError as exc:
        sys.stdout.flush()
        sys.stderr.write(f"Error: {exc}\n")
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
