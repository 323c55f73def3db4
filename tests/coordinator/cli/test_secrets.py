"""Secrets never leave where they belong.

The full demo runs with known secret values (fleet secret, admin token, the agent keys
derived from them, a fake ``VAST_API_KEY`` and ``CONTAINER_API_KEY`` in the environment);
then every log (captured stdout/stderr and logging, every file the agents wrote), every
operator API answer, and every text column of every table are searched: none appears.
The quicker tests check error messages, answers and the agent's redaction of shipped logs.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import logging
import sqlite3
from pathlib import Path
from typing import Any

import orjson
import pytest

from vast_manager.agent.lifecycle import LogBuffer
from vast_manager.coordinator.cli import demo
from vast_manager.coordinator.settings import Settings

from support.coord_support import ADMIN_TOKEN, SECRET_HEX, make_settings, start

FLEET_SECRET = "5e" * 32
DEMO_ADMIN_TOKEN = "demo-admin-token-" + "7b" * 16
VAST_API_KEY = "fake-vast-api-key-" + "c4" * 20
CONTAINER_API_KEY = "fake-container-api-key-" + "d9" * 20


def derived_key(secret_hex: str, agent_id: str) -> str:
    return hmac.new(bytes.fromhex(secret_hex), b"vast-manager agent key v1:" + agent_id.encode(),
                    hashlib.sha256).hexdigest()


def text_columns(db_path: Path) -> list[tuple[str, str, str]]:
    """(table, column, value) for every text value in every table."""
    out = []
    with contextlib.closing(sqlite3.connect(f"file:{db_path}?mode=ro", uri=True)) as db:
        tables = [r[0] for r in db.execute(
            "select name from sqlite_master where type = 'table' and name not like 'sqlite_%'")]
        for table in tables:
            cur = db.execute(f"select * from [{table}]")
            names = [d[0] for d in cur.description]
            for row in cur:
                for name, value in zip(names, row, strict=True):
                    if isinstance(value, str):
                        out.append((table, name, value))
    return out


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_full_demo_with_known_secrets_leaks_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setenv("VAST_API_KEY", VAST_API_KEY)
    monkeypatch.setenv("CONTAINER_API_KEY", CONTAINER_API_KEY)
    answers: list[bytes] = []
    real_call = demo._Api.call

    async def recording_call(self: Any, method: str, path: str, body: Any = None) -> Any:
        data = await real_call(self, method, path, body)
        answers.append(orjson.dumps(data))
        return data

    monkeypatch.setattr(demo._Api, "call", recording_call)
    caplog.set_level(logging.DEBUG)
    workdir = tmp_path / "demo"
    code = demo.run_demo(keep_dir=str(workdir), admin_token=DEMO_ADMIN_TOKEN,
                         fleet_secret=FLEET_SECRET, timeout_s=200.0)
    out, err = capfd.readouterr()
    assert code == demo.EXIT_OK, out[-3000:] + err[-3000:]

    db_path = workdir / "demo.db"
    with contextlib.closing(sqlite3.connect(f"file:{db_path}?mode=ro", uri=True)) as db:
        agent_ids = [r[0] for r in db.execute("select agent_id from agents")]
    assert len(agent_ids) >= 8
    secrets_ = {"fleet secret": FLEET_SECRET, "admin token": DEMO_ADMIN_TOKEN,
                "VAST_API_KEY": VAST_API_KEY, "CONTAINER_API_KEY": CONTAINER_API_KEY}
    secrets_.update({f"key of {a}": derived_key(FLEET_SECRET, a) for a in agent_ids})

    haystacks: dict[str, str] = {"stdout": out, "stderr": err, "logging": caplog.text}
    haystacks.update({f"answer {i}": a.decode() for i, a in enumerate(answers)})
    files = [p for p in workdir.rglob("*") if p.is_file()]
    agent_logs = [p for p in files if p.name == "agent.log"]
    assert len(agent_logs) >= 8
    for p in files:
        haystacks[f"file {p.relative_to(workdir)}"] = p.read_bytes().decode("latin-1")
    for table, column, value in text_columns(db_path):
        haystacks[f"db {table}.{column}"] = haystacks.get(f"db {table}.{column}", "") + value
    assert sum(len(v) for v in haystacks.values()) > 100_000  # the demo said a lot
    leaks = [(what, where) for what, secret in secrets_.items()
             for where, text in haystacks.items()
             if secret in text or secret.upper() in text]
    assert leaks == []
    # Nor the raw bytes of any key (binary files, the database pages).
    raw_keys = [bytes.fromhex(derived_key(FLEET_SECRET, a)) for a in agent_ids]
    raw_keys.append(bytes.fromhex(FLEET_SECRET))
    assert [p for p in files if any(k in p.read_bytes() for k in raw_keys)] == []


# --- quicker checks -------------------------------------------------------------------------


def test_settings_errors_and_repr_never_show_a_secret(tmp_path: Path) -> None:
    bad_secret = "zz" + "ab" * 31
    with pytest.raises(ValueError) as err:
        Settings.from_env({"VM_FLEET_SECRET": bad_secret, "VM_ADMIN_TOKEN": ADMIN_TOKEN},
                          config_dir=str(tmp_path))
    assert bad_secret not in str(err.value) and "ab" * 8 not in str(err.value)
    with pytest.raises(ValueError) as err:
        Settings.from_env({"VM_FLEET_SECRET": SECRET_HEX, "VM_ADMIN_TOKEN": "short-token"},
                          config_dir=str(tmp_path))
    assert "short-token" not in str(err.value)
    settings = make_settings(tmp_path)
    assert ADMIN_TOKEN not in repr(settings) and SECRET_HEX not in repr(settings)


async def test_error_answers_never_carry_a_secret(aiohttp_client: Any, tmp_path: Path) -> None:
    h = await start(aiohttp_client, tmp_path)
    agent = await h.issue("rig")
    answers = []
    for headers in ({"Authorization": "Bearer wrong-token-0123456789"},
                    {"Authorization": f"Bearer {agent.key.hex()}"}, {}):
        resp = await h.client.get("/api/instances", headers=headers)
        answers.append(await resp.read())
    for path, body in (("/v1/hello", b"not json"), ("/v1/result", b"{}"),
                       ("/v1/heartbeat", b'{"seq": "x"}')):
        status, _, (resp, raw, _) = await agent.post_raw(path, body)
        assert status in (400, 409)
        answers.append(raw)
    bad = h.agent(agent.agent_id, b"\x00" * 32)
    _, _, (_, raw, _) = await bad.post_raw("/v1/hello", b"{}")
    answers.append(raw)
    for raw in answers:
        text = raw.decode()
        assert ADMIN_TOKEN not in text and SECRET_HEX not in text
        assert agent.key.hex() not in text
        assert set(orjson.loads(raw)) >= {"error", "message"}


def test_shipped_logs_are_redacted_on_the_agent() -> None:
    key_hex = "ab" * 32
    buffer = LogBuffer([key_hex, CONTAINER_API_KEY], clock=lambda: 1.0)
    buffer.add("agent", f"starting with VM_AGENT_KEY={key_hex}")
    buffer.child_line("cuzk", f"env CONTAINER_API_KEY={CONTAINER_API_KEY} ok")
    logger = logging.getLogger("vast_manager.agent.test-redaction")
    logger.addHandler(buffer)
    try:
        logger.error("failed: %s", ValueError(f"bad key {key_hex}"))
    finally:
        logger.removeHandler(buffer)
    lines = buffer.take()
    assert len(lines) == 3
    for line in lines:
        assert key_hex not in line.text and CONTAINER_API_KEY not in line.text
        assert "[redacted]" in line.text
