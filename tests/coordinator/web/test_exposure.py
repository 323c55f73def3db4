"""Exposure: HTTPS served directly, the operator side on its own
address (--admin-listen), and the serve options that set them."""

from __future__ import annotations

import ssl
import subprocess
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from click.testing import CliRunner

from vast_manager.coordinator.cli.commands import cli
from vast_manager.coordinator.settings import Settings, parse_listen
from vast_manager.coordinator.web.server import start_server

from support.coord_support import ADMIN, ADMIN_TOKEN, make_settings
from support.fakes_provider import FakeProvider
from support.tools import require_tool


def self_signed(tmp_path: Path) -> tuple[Path, Path]:
    """A throwaway certificate for 127.0.0.1 (cryptography if installed, else openssl)."""
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    try:
        import datetime

        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID
    except ImportError:
        openssl = require_tool("openssl", "or the cryptography package")
        subprocess.run(
            [openssl, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
             "-nodes", "-keyout", str(key), "-out", str(cert), "-days", "1",
             "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
            check=True, capture_output=True, timeout=60,
        )
        return cert, key
    import ipaddress

    private = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name)
        .public_key(private.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName(
            [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        .sign(private, hashes.SHA256())
    )
    cert.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key.write_bytes(private.private_bytes(serialization.Encoding.PEM,
                                          serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption()))
    return cert, key


async def test_tls_serves_https(tmp_path: Path) -> None:
    cert, key = self_signed(tmp_path)
    settings = make_settings(tmp_path, port=0, tls_cert=str(cert), tls_key=str(key))
    server = await start_server(settings, FakeProvider())
    try:
        assert server.url.startswith("https://127.0.0.1:")
        assert server.settings.coordinator_url.startswith("https://")  # what agents are told
        trust = ssl.create_default_context(cafile=str(cert))
        async with aiohttp.ClientSession() as session:
            async with session.get(server.url + "/api/instances", headers=ADMIN,
                                   ssl=trust) as resp:
                assert resp.status == 200
                assert await resp.json() == []
            async with session.get(server.url + "/", ssl=trust) as resp:
                assert resp.status == 200
            async with session.post(server.url + "/auth/login", json={"token": ADMIN_TOKEN},
                                    ssl=trust) as resp:
                assert resp.status == 200
                assert "secure" in resp.headers["Set-Cookie"].lower()
            # Heartbeats are served too.
            async with session.post(server.url + "/v1/heartbeat", data=b"{}",
                                    ssl=trust) as resp:
                assert resp.status == 401
            # Plain HTTP on the TLS port gets no answer.
            plain = server.url.replace("https://", "http://")
            with pytest.raises(aiohttp.ClientError):
                async with session.get(plain + "/api/instances", headers=ADMIN) as resp:
                    await resp.read()
    finally:
        await server.stop()


async def _status(session: aiohttp.ClientSession, method: str, url: str, **kw: Any) -> int:
    async with session.request(method, url, **kw) as resp:
        await resp.read()
        return resp.status


async def test_admin_listen_separates_agents_from_operators(tmp_path: Path) -> None:
    settings = make_settings(tmp_path, port=0, admin_listen="127.0.0.1:0")
    server = await start_server(settings, FakeProvider())
    try:
        assert server.admin_url is not None and server.admin_url != server.url
        agent_side, admin_side = server.url, server.admin_url
        async with aiohttp.ClientSession() as session:
            # The agents' address: /v1/* only (an unsigned hello reaches the auth check).
            assert await _status(session, "POST", agent_side + "/v1/hello", data=b"{}") == 401
            assert await _status(session, "POST", agent_side + "/v1/heartbeat",
                                 data=b"{}") == 401
            for path in ("/api/instances", "/metrics", "/", "/static/app.js"):
                assert await _status(session, "GET", agent_side + path, headers=ADMIN) == 404
            assert await _status(session, "POST", agent_side + "/auth/login",
                                 json={"token": "x"}) == 404
            # The admin address: everything but /v1/*.
            assert await _status(session, "POST", admin_side + "/v1/hello", data=b"{}") == 404
            assert await _status(session, "POST", admin_side + "/v1/heartbeat",
                                 data=b"{}") == 404
            assert await _status(session, "GET", admin_side + "/api/instances",
                                 headers=ADMIN) == 200
            assert await _status(session, "GET", admin_side + "/metrics", headers=ADMIN) == 200
            assert await _status(session, "GET", admin_side + "/") == 200
            # The operator API still wants its token on its own address.
            assert await _status(session, "GET", admin_side + "/api/instances") == 401
    finally:
        await server.stop()


def test_settings_for_exposure(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="VM_TLS_CERT and VM_TLS_KEY"):
        make_settings(tmp_path, tls_cert="cert.pem")
    with pytest.raises(ValueError, match="VM_ADMIN_LISTEN"):
        make_settings(tmp_path, admin_listen="no-port")
    with pytest.raises(ValueError, match="VM_LOG_FORMAT"):
        make_settings(tmp_path, log_format="xml")
    assert parse_listen("[::1]:8421") == ("::1", 8421)
    assert parse_listen("0.0.0.0:9000") == ("0.0.0.0", 9000)
    env = {"VM_FLEET_SECRET": "11" * 32, "VM_ADMIN_TOKEN": "exposure-token-0123456789",
           "VM_CONFIG_DIR": str(tmp_path / "c")}
    assert Settings.from_env({**env, "VM_METRICS_PUBLIC": "false"}).metrics_public is False
    assert Settings.from_env({**env, "VM_METRICS_PUBLIC": "yes"}).metrics_public is True
    with pytest.raises(ValueError, match="VM_METRICS_PUBLIC"):
        Settings.from_env({**env, "VM_METRICS_PUBLIC": "maybe"})


def test_serve_refuses_an_unreadable_certificate(tmp_path: Path) -> None:
    env = {"VM_FLEET_SECRET": "11" * 32, "VM_ADMIN_TOKEN": "exposure-token-0123456789",
           "VM_CONFIG_DIR": str(tmp_path / "c")}
    result = CliRunner().invoke(
        cli,
        ["serve", "--db", str(tmp_path / "x.db"), "--port", "0",
         "--tls-cert", str(tmp_path / "missing.pem"), "--tls-key", str(tmp_path / "k.pem")],
        env=env,
    )
    assert result.exit_code == 2, result.output  # a setting that cannot work
    assert "cannot load the TLS certificate" in result.output
    result = CliRunner().invoke(cli, ["serve", "--admin-listen", "nowhere"], env=env)
    assert result.exit_code == 2 and "--admin-listen (VM_ADMIN_LISTEN)" in result.output
