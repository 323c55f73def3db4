"""The C1 input of the benchmark, checked as cuzk will read it, before any rent is spent on it.

``cuzk-bench batch --c1 FILE`` sends the file's bytes as they are; the daemon
parses them as Curio's wrapper (cuzk-core/src/prover.rs ``C1OutputWrapper``:
``SectorNum``, ``Phase1Out``, ``SectorSize``) whose ``Phase1Out`` is the
base64 (standard alphabet, padded) of a ``SealCommitPhase1Output`` JSON
object, and refuses what ``parse_c1_output`` (cuzk-core/src/pipeline.rs)
refuses: a sector size other than 32 GiB, an all-zero ``comm_d``/``comm_r``
or ``seed``. A file that fails here would make every proof FAILED
(docs/cuzk.md). The sector number the proofs must name comes from the
wrapper; the miner id is not in the file (only bound into ``replica_id``),
so it comes from ``VM_C1_MINER_ID``.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

SECTOR_SIZE_32GIB = 34359738368
U64_MAX = (1 << 64) - 1
# Fields cuzk reads from SealCommitPhase1Output (pipeline.rs parse_c1_output,
# prover.rs verify_porep_proof).
PHASE1_FIELDS = ("registered_proof", "vanilla_proofs", "comm_r", "comm_d", "replica_id", "seed",
                 "ticket")
WRAPPER_FIELDS = ("SectorNum", "Phase1Out", "SectorSize")
MAX_C1_BYTES = 512 * 1024 * 1024  # a real one is about 51 MB (cuzk-daemon/src/main.rs)


class C1Error(ValueError):
    """A C1 input cuzk would refuse. ``str()`` is one sentence naming the file;
    ``cuzk_error`` is how the daemon words the same failure (its context message)."""

    def __init__(self, path: Path, reason: str, cuzk_error: str) -> None:
        super().__init__(f"C1 file {path} {reason}")
        self.path = path
        self.reason = reason
        self.cuzk_error = cuzk_error


@dataclass(frozen=True, slots=True)
class C1Input:
    path: Path
    size_bytes: int
    sector_num: int
    sector_size: int
    registered_proof: str
    phase1: dict[str, Any]


def _uint(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= U64_MAX


def _bytes32(value: Any) -> bool:
    return (
        isinstance(value, list) and len(value) == 32
        and all(isinstance(b, int) and not isinstance(b, bool) and 0 <= b <= 255 for b in value)
    )


def parse_c1(data: bytes, path: Path) -> C1Input:
    """Check ``data`` (the bytes of ``path``) as cuzk parses a PoRep C1; raises `C1Error`."""
    try:
        wrapper = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise C1Error(path, f"is not JSON ({exc})", "failed to parse C1 output wrapper JSON") \
            from None
    if not isinstance(wrapper, dict):
        raise C1Error(path, "is not Curio's C1 wrapper: it is not a JSON object",
                      "failed to parse C1 output wrapper JSON")
    missing = [k for k in WRAPPER_FIELDS if k not in wrapper]
    if missing:
        found = ", ".join(sorted(str(k) for k in wrapper)[:8]) or "none"
        raise C1Error(path, f"is not Curio's C1 wrapper: it lacks {', '.join(missing)} "
                      f"(its keys: {found})", "failed to parse C1 output wrapper JSON")
    for key in ("SectorNum", "SectorSize"):
        if not _uint(wrapper[key]):
            raise C1Error(path, f"is not Curio's C1 wrapper: {key} is not an unsigned integer",
                          "failed to parse C1 output wrapper JSON")
    if not isinstance(wrapper["Phase1Out"], str):
        raise C1Error(path, "is not Curio's C1 wrapper: Phase1Out is not a base64 string",
                      "failed to parse C1 output wrapper JSON")
    try:
        raw = base64.b64decode(wrapper["Phase1Out"], validate=True)
    except (binascii.Error, ValueError) as exc:
        raise C1Error(path, f"has a Phase1Out that is not base64 ({exc})",
                      "failed to decode base64 Phase1Output") from None
    try:
        phase1 = orjson.loads(raw)
    except orjson.JSONDecodeError:
        phase1 = None
    if not isinstance(phase1, dict):
        raise C1Error(path, "has a Phase1Out that is not a SealCommitPhase1Output JSON object",
                      "failed to deserialize SealCommitPhase1Output from JSON")
    lacking = [k for k in PHASE1_FIELDS if k not in phase1]
    if lacking:
        raise C1Error(path, "has a Phase1Out that is not a SealCommitPhase1Output: it lacks "
                      + ", ".join(lacking),
                      "failed to deserialize SealCommitPhase1Output from JSON")
    proof = phase1["registered_proof"]
    if not isinstance(proof, str):
        raise C1Error(path, "has a registered_proof that is not a seal proof name",
                      "failed to deserialize SealCommitPhase1Output from JSON")
    for key in ("comm_r", "comm_d", "seed", "ticket"):
        if not _bytes32(phase1[key]):
            raise C1Error(path, f"has a {key} that is not 32 bytes",
                          "failed to deserialize SealCommitPhase1Output from JSON")
    if not proof.startswith("StackedDrg32GiB"):
        raise C1Error(path, f"was made for {proof}: cuzk proves 32 GiB PoRep sectors only",
                      "pipelined synthesis currently supports only 32 GiB sectors")
    for key, text in (("comm_d", "Invalid all zero commitment (comm_d)"),
                      ("comm_r", "Invalid all zero commitment (comm_r)"),
                      ("seed", "Invalid porep challenge seed")):
        if not any(phase1[key]):
            raise C1Error(path, f"has an all-zero {key}", text)
    if not phase1["vanilla_proofs"]:
        raise C1Error(path, "has no vanilla proofs", "failed to convert vanilla proofs")
    return C1Input(path, len(data), int(wrapper["SectorNum"]), int(wrapper["SectorSize"]), proof,
                   phase1)


def check_c1(path: Path) -> C1Input:
    """Read and check the C1 file at ``path`` (blocking: a real one is ~51 MB)."""
    try:
        size = path.stat().st_size
        if not path.is_file():
            raise C1Error(path, "is not a file", "failed to read")
        if size > MAX_C1_BYTES:
            raise C1Error(path, f"is {size} bytes, far larger than a C1 output", "failed to read")
        data = path.read_bytes()
    except OSError as exc:
        raise C1Error(path, f"cannot be read: {exc.strerror or exc}", "failed to read") from None
    return parse_c1(data, path)
