"""Simulated C1 inputs: files in Curio's wrapper format that name a sector and a miner.

A real ``SealCommitPhase1Output`` binds the prover (miner) and sector into
its ``replica_id``; cuzk's self-check of every proof fails when the request
names another sector or miner (docs/cuzk.md). The simulator's stand-in C1
does the same with its own derivation (a SHA-256 over the miner id, the
sector number, the ticket and comm_d; not Filecoin's), so a simulated proof
fails exactly when a real one would. The vanilla proofs are a tiny
placeholder: every number these files lead to is simulated.
"""

from __future__ import annotations

import base64
import hashlib
from pathlib import Path

import orjson

from vast_manager.agent.c1 import SECTOR_SIZE_32GIB, C1Error, C1Input, parse_c1

REGISTERED_PROOF = "StackedDrg32GiBV1_1"


def _b32(label: str, *parts: int | bytes) -> list[int]:
    h = hashlib.sha256(f"vast-manager simulated C1 {label}".encode())
    for p in parts:
        h.update(p if isinstance(p, bytes) else p.to_bytes(8, "big"))
    return list(h.digest())


def replica_id(miner_id: int, sector_num: int, ticket: list[int], comm_d: list[int]) -> list[int]:
    """The simulator's stand-in for the replica id that binds a C1 to its sector and miner."""
    digest = _b32("replica", miner_id, sector_num, bytes(ticket), bytes(comm_d))
    digest[31] &= 0x3F  # a field element, as a real replica id is
    return digest


def make_c1(sector_num: int = 1, miner_id: int = 1000) -> bytes:
    """A simulated C1 file's bytes for ``sector_num`` of ``miner_id``."""
    ticket = _b32("ticket", sector_num)
    comm_d = _b32("comm_d", sector_num)
    phase1 = {
        "registered_proof": REGISTERED_PROOF,
        "vanilla_proofs": {"StackedDrg32GiBV1": [[{"simulated": True}]]},
        "comm_r": _b32("comm_r", miner_id, sector_num),
        "comm_d": comm_d,
        "replica_id": replica_id(miner_id, sector_num, ticket, comm_d),
        "seed": _b32("seed", sector_num),
        "ticket": ticket,
    }
    wrapper = {
        "SectorNum": sector_num,
        "Phase1Out": base64.b64encode(orjson.dumps(phase1)).decode(),
        "SectorSize": SECTOR_SIZE_32GIB,
    }
    return orjson.dumps(wrapper)


def write_c1(path: Path, sector_num: int = 1, miner_id: int = 1000) -> Path:
    path.write_bytes(make_c1(sector_num, miner_id))
    return path


def check_request(data: bytes, sector_num: int, miner_id: int) -> tuple[str | None, bool]:
    """How the simulated daemon takes a proof request's C1: (cuzk's parse error or None,
    whether the sector and miner match it so that the proof's self-check passes)."""
    try:
        c1: C1Input = parse_c1(data, Path("<request>"))
    except C1Error as exc:
        return exc.cuzk_error, False
    p = c1.phase1
    expected = replica_id(miner_id, sector_num, list(p["ticket"]), list(p["comm_d"]))
    return None, p["replica_id"] == expected


def main(argv: list[str] | None = None) -> int:
    """``vm-sim-c1 PATH [--sector-num N] [--miner-id M]``: write a simulated C1 file."""
    import argparse

    parser = argparse.ArgumentParser(
        prog="vm-sim-c1",
        description="Write a simulated C1 input (Curio's wrapper format) for the simulated cuzk.",
    )
    parser.add_argument("path", type=Path)
    parser.add_argument("--sector-num", type=int, default=1)
    parser.add_argument("--miner-id", type=int, default=1000)
    args = parser.parse_args(argv)
    try:
        write_c1(args.path, args.sector_num, args.miner_id)
    except OSError as exc:
        parser.exit(1, f"vm-sim-c1: cannot write {args.path}: {exc.strerror}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
