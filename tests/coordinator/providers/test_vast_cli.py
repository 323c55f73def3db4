"""`vast-manager serve --provider vast` as a process against the fake vast.ai, and the
operator CLI (`offers`, `deploy`, `destroy`) against it."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import secrets
import signal
import socket
import string
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from vast_manager.coordinator.providers.vast.provider import (
    DEFAULT_ONSTART,
    ProviderConfigError,
    from_settings,
)
from vast_manager.coordinator.settings import Settings

from support.fakevast import FAKE_API_KEY, FakeVast
from support.paths import REPO_ROOT

ROOT = REPO_ROOT
TOKEN = "vast-cli-admin-token-0123456789"
IMAGE = "ghcr.io/example/vast-agent:cli"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def base_env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("VM_", "VAST_")) and k != "PYTEST_CURRENT_TEST"}
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    env.update({
        "HOME": str(home),  # no key file of the person running the tests is found
        "XDG_CONFIG_HOME": str(home / ".config"),
        "PYTHONPATH": str(ROOT),
        "VM_ADMIN_TOKEN": TOKEN,
        "VM_FLEET_SECRET": secrets.token_hex(32),
    })
    return env


async def run_cli(env: dict[str, str], *args: str) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "vast_manager.coordinator.cli", *args, env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(errors="replace")


@dataclass
class Served:
    fake: FakeVast
    env: dict[str, str]
    url: str
    proc: asyncio.subprocess.Process


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[Served]:
    async with FakeVast() as fake:
        fake.add_offer(9101, 51001, gpu_name="RTX 5070 Ti", dph_total=0.19, cpu_ram=386000)
        fake.add_offer(9102, 51002, gpu_name="RTX 4090", dph_total=0.42)
        fake.add_offer(9103, 51003, gpu_name="RTX 4090", dph_total=1.4)  # above dph<=0.9
        env = base_env(tmp_path)
        env.update({"VAST_API_KEY": FAKE_API_KEY, "VAST_URL": fake.url, "VM_VAST_IMAGE": IMAGE,
                    # Tests reach loopback only: no registry is asked about the image.
                    "VM_PREFLIGHT_REGISTRY": "false"})
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        env["VM_URL"] = url
        with open(tmp_path / "serve.log", "wb") as log:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "vast_manager.coordinator.cli", "serve", "--provider", "vast",
                "--db", str(tmp_path / "fleet.db"), "--port", str(port),
                env=env, stdout=log, stderr=asyncio.subprocess.STDOUT, cwd=tmp_path,
                start_new_session=True,
            )
        try:
            deadline = time.monotonic() + 30
            async with aiohttp.ClientSession() as session:
                while True:
                    assert proc.returncode is None, (tmp_path / "serve.log").read_text()
                    with contextlib.suppress(aiohttp.ClientError):
                        async with session.get(
                            f"{url}/api/instances", headers={"Authorization": f"Bearer {TOKEN}"}
                        ) as resp:
                            if resp.status == 200:
                                break
                    if time.monotonic() > deadline:
                        raise AssertionError("the coordinator did not start")
                    await asyncio.sleep(0.1)
            yield Served(fake, env, url, proc)
        finally:
            if proc.returncode is None:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    await asyncio.wait_for(proc.wait(), 30)
                except TimeoutError:
                    os.killpg(proc.pid, signal.SIGKILL)
                    await proc.wait()
    assert proc.returncode is not None


async def test_offers_deploy_destroy_through_the_cli(served: Served) -> None:
    fake, env = served.fake, served.env
    code, out = await run_cli(env, "offers", "--json")
    assert code == 0, out
    rows = json.loads(out)
    # The default filter leaves out the $1.40 offer; the search went to the fake with
    # the account key in the header only.
    assert sorted(r["id"] for r in rows) == [9101, 9102]
    # Nothing measured yet: the rate model's priors alone, which say so.
    assert all(r["known"] is False and r["predicted_rate_low"] < r["predicted_rate_high"]
               and "measured yet" in r["prediction_basis"] for r in rows)
    (search,) = fake.calls("POST", "/api/v0/bundles/")
    assert search.headers["Authorization"] == f"Bearer {FAKE_API_KEY}"
    assert search.body["dph_total"] == {"lte": "0.9"}
    assert search.body["allocated_storage"] == 250.0

    code, out = await run_cli(env, "offers", "--filter", "gpu_name=RTX_4090 dph<=2")
    assert code == 0, out
    assert "9102" in out and "9103" in out and "9101" not in out

    # The $0.19/h seen was priced at the search's 250 GB; a 300 GB disk bills more storage,
    # which the price check counts (nothing is created).
    code, out = await run_cli(env, "deploy", "9101", "--min-rate", "40", "--disk", "300",
                              "--max-price", "0.19")
    assert code != 0 and "with a 300 GB disk" in out, out
    assert fake.calls("PUT", "/api/v0/asks/") == []
    code, out = await run_cli(env, "deploy", "9101", "--min-rate", "40", "--disk", "300",
                              "--max-price", "0.21")
    assert code == 0, out
    assert out.startswith("Instance 1 (agent ag_"), out
    (create,) = fake.calls("PUT", "/api/v0/asks/")
    assert create.path == "/api/v0/asks/9101/"
    assert create.body["image"] == IMAGE and create.body["disk"] == 300.0
    assert create.body["onstart"] == DEFAULT_ONSTART
    assert create.body["env"]["VM_COORDINATOR_URL"] == served.url
    (vid,) = fake.instances

    # Refusals are one line with exit status 1, and nothing is created.
    code, out = await run_cli(env, "deploy", "9102", "--max-price", "0.40")
    assert code == 1 and "above the $0.4000/h you saw" in out, out
    code, out = await run_cli(env, "deploy", "9101")
    assert code == 1 and "gone" in out.lower(), out
    assert len(fake.calls("PUT", "/api/v0/asks/")) == 1

    code, out = await run_cli(env, "destroy", "1")
    assert code == 0, out
    assert fake.instances == {}
    assert fake.destroys_of(vid) == ["account"]
    code, out = await run_cli(env, "status", "--json")
    assert code == 0 and json.loads(out)[0]["state"] == "destroyed", out


async def test_a_small_slice_is_flagged_in_offers_and_refused_at_deploy(served: Served) -> None:
    fake, env = served.fake, served.env
    # 1 GPU of an 8-GPU 512 GB host: vast.ai lists the host's 515 GB and 256 cores,
    # and the instance's 32; it would get about 64 GB.
    fake.add_slice(9201, 52001, num_gpus=1, host_gpus=8, host_cpu_cores=256,
                   host_cpu_ram_mb=515000, dph_total=0.35)
    # A whole 2-GPU host with 256 GB.
    fake.add_offer(9202, 52002, num_gpus=2, cpu_cores=64, cpu_cores_effective=64.0,
                   cpu_ram=257000, dph_total=0.80)
    code, out = await run_cli(env, "offers", "--wide")  # --wide: with each basis
    assert code == 0, out
    print(f"\n$ vast-manager offers --wide\n{out}")  # shown with pytest -s
    (small,) = [line for line in out.splitlines() if line.startswith("9201 ")]
    (whole,) = [line for line in out.splitlines() if line.startswith("9202 ")]
    assert "TOO-SMALL" in small and " 64 " in small and " 32 " in small
    assert "would get about 64 GB of RAM (515 GB x 32/256 cores = 64.4 GB)" in small
    assert "TOO-SMALL" not in whole and " 257 " in whole
    code, out = await run_cli(env, "deploy", "9201")
    print(f"$ vast-manager deploy 9201  (exit {code})\n{out}")
    assert code == 1, out
    assert "Offer 9201 is refused: its instance would get about 64 GB of RAM" in out
    assert "below the 128 GB cuzk needs (VM_MIN_INSTANCE_RAM_GB)" in out
    assert fake.calls("PUT", "/api/v0/asks/") == []
    code, out = await run_cli(env, "deploy", "9202")
    print(f"$ vast-manager deploy 9202  (exit {code})\n{out}")
    assert code == 0, out
    assert [c.path for c in fake.calls("PUT", "/api/v0/asks/")] == ["/api/v0/asks/9202/"]


async def test_a_refused_key_is_named_by_its_source(served: Served) -> None:
    served.fake.api_key = "another-key"  # the key in VAST_API_KEY is no longer valid
    code, out = await run_cli(served.env, "offers")
    assert code == 1, out
    assert "refused the API key from VAST_API_KEY" in out and "Invalid user key" in out
    assert FAKE_API_KEY not in out


async def test_serve_without_an_api_key_or_image_says_what_to_set(tmp_path: Path) -> None:
    env = base_env(tmp_path)
    env["VM_VAST_IMAGE"] = IMAGE
    code, out = await run_cli(env, "serve", "--provider", "vast", "--port", "0",
                              "--db", str(tmp_path / "a.db"))
    assert code == 2, out  # a setting that cannot work
    assert "no vast.ai API key" in out and "VAST_API_KEY" in out
    assert "Traceback" not in out
    env = base_env(tmp_path)
    env["VAST_API_KEY"] = FAKE_API_KEY
    code, out = await run_cli(env, "serve", "--provider", "vast", "--port", "0",
                              "--db", str(tmp_path / "b.db"))
    assert code == 2 and "VM_VAST_IMAGE" in out and "Traceback" not in out, out
    assert FAKE_API_KEY not in out


def settings(tmp_path: Path, **values: Any) -> Settings:
    return Settings.from_env({"VM_ADMIN_TOKEN": TOKEN, "VM_FLEET_SECRET": "44" * 32},
                             config_dir=str(tmp_path / "config"), **values)


async def test_from_settings_finds_the_key_as_the_cli_does(tmp_path: Path) -> None:
    home = tmp_path / "home"
    (home / ".config" / "vastai").mkdir(parents=True)
    (home / ".config" / "vastai" / "vast_api_key").write_text("key-from-file\n")
    provider = from_settings(
        settings(tmp_path, vast_image=IMAGE, vast_runtype="args",
                 vast_env='{"VM_PARAMS_CMD": "curio fetch-params 32", "VM_BENCH_PROOFS": 6}',
                 vast_filter="num_gpus>=2", deploy_disk_gb=300),
        environ={"VAST_URL": "http://127.0.0.1:9/"}, home=home,
    )
    try:
        assert provider.client._api_key == "key-from-file"
        assert provider.client.base_url == "http://127.0.0.1:9"
        assert provider.runtype == "args" and provider.disk_gb == 300
        assert provider.extra_env == {"VM_PARAMS_CMD": "curio fetch-params 32",
                                      "VM_BENCH_PROOFS": "6"}
        assert provider.default_filter == "num_gpus>=2"
        assert provider.onstart == DEFAULT_ONSTART
    finally:
        await provider.close()


@pytest.mark.parametrize(
    "values, words",
    [
        ({}, "VM_VAST_IMAGE"),
        ({"vast_image": IMAGE, "vast_env": "[1]"}, "VM_VAST_ENV must be a JSON object"),
        ({"vast_image": IMAGE, "vast_env": '{"A B": "1"}'}, "not a variable name"),
        ({"vast_image": IMAGE, "vast_onstart": "".join(
            random.Random(3).choices(string.ascii_letters, k=9000))},
         "9001 characters and .* even compressed, above vast.ai.s 4048"),
    ],
)
def test_from_settings_refuses_bad_settings(
    tmp_path: Path, values: dict[str, Any], words: str
) -> None:
    with pytest.raises(ProviderConfigError, match=words):
        from_settings(settings(tmp_path, **values), environ={"VAST_API_KEY": "k"},
                      home=tmp_path)


def test_onstart_default_is_the_templates() -> None:
    template = json.loads((ROOT / "image" / "vast-template.json").read_text())
    assert template["onstart"] == DEFAULT_ONSTART
    assert DEFAULT_ONSTART in (ROOT / "image" / "vast-template.md").read_text()
