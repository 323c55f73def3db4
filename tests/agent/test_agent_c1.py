"""The C1 input checked as cuzk parses it (agent/c1.py; docs/cuzk.md, the pinned fixture)."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import orjson
import pytest

from vast_manager.agent.c1 import SECTOR_SIZE_32GIB, C1Error, check_c1, parse_c1
from vast_manager.sim.fake_c1 import check_request, make_c1

from support.cuzk_surface import SURFACE


def wrapper(**over: Any) -> dict[str, Any]:
    return {**orjson.loads(make_c1(7, 1234)), **over}


def phase1(**over: Any) -> str:
    inner = orjson.loads(base64.b64decode(wrapper()["Phase1Out"]))
    inner.update(over)
    return base64.b64encode(orjson.dumps(inner)).decode()


def refusal(tmp_path: Path, body: bytes) -> C1Error:
    path = tmp_path / "c1.json"
    path.write_bytes(body)
    with pytest.raises(C1Error) as info:
        check_c1(path)
    err = info.value
    assert str(err).startswith(f"C1 file {path} ") and "\n" not in str(err)
    assert err.cuzk_error in SURFACE["c1"]["errors"] + ["failed to read",
                                                        "failed to convert vanilla proofs"]
    return err


def test_a_good_c1_gives_its_sector_number(tmp_path: Path) -> None:
    path = tmp_path / "c1.json"
    path.write_bytes(make_c1(7, 1234))
    c1 = check_c1(path)
    assert (c1.sector_num, c1.sector_size) == (7, SECTOR_SIZE_32GIB)
    assert c1.registered_proof == "StackedDrg32GiBV1_1"
    assert set(SURFACE["c1"]["wrapper_fields"]) == {"SectorNum", "Phase1Out", "SectorSize"}
    assert set(SURFACE["c1"]["phase1_fields"]) <= set(c1.phase1)


@pytest.mark.parametrize(
    ("body", "says", "cuzk"),
    [
        (b"not json", "is not JSON", "failed to parse C1 output wrapper JSON"),
        (b"[1, 2]", "is not Curio's C1 wrapper: it is not a JSON object",
         "failed to parse C1 output wrapper JSON"),
        (b'{"simulated": true}', "lacks SectorNum, Phase1Out, SectorSize (its keys: simulated)",
         "failed to parse C1 output wrapper JSON"),
        (orjson.dumps(wrapper(SectorNum=-1)), "SectorNum is not an unsigned integer",
         "failed to parse C1 output wrapper JSON"),
        (orjson.dumps(wrapper(Phase1Out="%%%")), "has a Phase1Out that is not base64",
         "failed to decode base64 Phase1Output"),
        (orjson.dumps(wrapper(Phase1Out=base64.b64encode(b"[]").decode())),
         "not a SealCommitPhase1Output JSON object",
         "failed to deserialize SealCommitPhase1Output from JSON"),
        (orjson.dumps(wrapper(Phase1Out=phase1(registered_proof="StackedDrg64GiBV1_1"))),
         "was made for StackedDrg64GiBV1_1: cuzk proves 32 GiB PoRep sectors only",
         "pipelined synthesis currently supports only 32 GiB sectors"),
        (orjson.dumps(wrapper(Phase1Out=phase1(comm_d=[0] * 32))), "has an all-zero comm_d",
         "Invalid all zero commitment (comm_d)"),
        (orjson.dumps(wrapper(Phase1Out=phase1(seed=[1] * 31))), "has a seed that is not 32 bytes",
         "failed to deserialize SealCommitPhase1Output from JSON"),
    ],
)
def test_what_cuzk_would_refuse_is_refused_in_one_sentence(
    tmp_path: Path, body: bytes, says: str, cuzk: str
) -> None:
    err = refusal(tmp_path, body)
    assert says in str(err)
    assert err.cuzk_error == cuzk


def test_missing_and_unreadable_files(tmp_path: Path) -> None:
    with pytest.raises(C1Error, match=r"cannot be read: No such file or directory"):
        check_c1(tmp_path / "nope.json")
    with pytest.raises(C1Error, match=r"is not a file"):
        check_c1(tmp_path)


def test_the_simulated_daemon_binds_a_c1_to_its_sector_and_miner() -> None:
    data = make_c1(7, 1234)
    assert check_request(data, 7, 1234) == (None, True)
    assert check_request(data, 7, 1000) == (None, False)  # fails the self-check
    assert check_request(data, 8, 1234) == (None, False)
    assert check_request(b"{}", 7, 1234)[0] == "failed to parse C1 output wrapper JSON"
    assert parse_c1(data, Path("x")).sector_num == 7
