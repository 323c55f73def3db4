"""LocalProvider: a stand-in for vast.ai that rents machines from the local catalog.

"Creating an instance" spawns ``vm-sim-agent run`` (the agent on the simulated
machine) as a child process on this machine, with the simulated cuzk
(``vm-sim-cuzk``, ``vm-sim-cuzk-bench``), the fake NVML and the offer's hardware
profile, so the agent goes through its real lifecycle over the real wire contract.
"Destroying" ends that process and every process under it. A small loopback file
server stands in for the proof
parameter download (a few MiB of generated files labelled simulated, served
at a rate scaled from the offer's ``inet_down``).

Everything here is for the demo and tests; the numbers it leads to are
simulated.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import psutil
from aiohttp import web

from vast_manager.agent.config import SETTINGS_BY_NAME as AGENT_SETTINGS
from vast_manager.coordinator.decisions.share import instance_share
from vast_manager.coordinator.offers import parse_offer, parse_offers
from vast_manager.coordinator.providers.base import (
    CreatedInstance,
    Offer,
    OfferGone,
    ProviderInstance,
)
from vast_manager.coordinator.providers.local.catalog import catalog_offers

log = logging.getLogger(__name__)

# Simulated parameter files: small stand-ins for the v28 .params/.vk files.
PARAM_FILES = (
    ("v28-stacked-proof-of-replication-32g.params.sim", 3 * 1024 * 1024),
    ("v28-stacked-proof-of-replication-32g.vk.sim", 64 * 1024),
    ("v28-proof-of-spacetime-fallback-32g.params.sim", 1 * 1024 * 1024),
)
STOP_GRACE_S = 5.0
MARKER_ENV = "VM_LOCAL_INSTANCE"


def console_script(name: str) -> str:
    """A console script of this installation (beside the interpreter, else on PATH)."""
    beside = Path(sys.executable).parent / name
    if beside.exists():
        return str(beside)
    found = shutil.which(name)
    if found is None:
        raise RuntimeError(f"{name} is not installed; run pip install -e . first")
    return found


@functools.cache
def _simulated_c1() -> bytes:
    """A simulated C1 in Curio's wrapper format (sector 1, miner 1000: the agent's default
    VM_C1_MINER_ID), made once by the simulator's own tool (the coordinator imports no
    agent code)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "c1.json"
        subprocess.run([console_script("vm-sim-c1"), str(path)], check=True, timeout=60)
        return path.read_bytes()


#: What a process needs of the coordinator's environment to run at all; nothing else of
#: it reaches an agent (docs/reliability.md, "Local agents").
PROCESS_VARIABLES = frozenset({"PATH", "HOME", "USER", "LOGNAME", "LANG", "LANGUAGE", "TZ",
                               "TMPDIR", "PYTHONPATH", "VIRTUAL_ENV", "RUST_LOG",
                               "PYTHONDONTWRITEBYTECODE", "SSL_CERT_FILE", "SSL_CERT_DIR"})


def agent_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """The variables a spawned agent gets from ``environ``: a process's basics (and its
    locale) and the agent's own settings (the ``VM_*`` table of docs/architecture.md), never the
    coordinator's admin token, fleet secret or provider key."""
    return {k: v for k, v in environ.items()
            if k in PROCESS_VARIABLES or k.startswith("LC_") or k in AGENT_SETTINGS
            or k.startswith("VM_SIM_")}


def simulated_machine_env(
    home: Path, offer: Offer, time_scale: float, sample_interval_s: float = 0.1
) -> dict[str, str]:
    """What an agent needs to run on the simulated cuzk as the instance of ``offer``:
    its folders and C1 input under ``home``, the simulator's programs, the fake NVML
    and the hardware profile: what the instance gets of the host (its cores,
    ``cpu_cores_effective``, and its share of the RAM, ``coordinator.decisions.share``), not
    the whole host vast.ai lists. Creates the folders."""
    for sub in ("state", "params"):
        (home / sub).mkdir(parents=True, exist_ok=True)
    c1 = home / "c1.json"
    c1.write_bytes(_simulated_c1())
    return {
        "VM_STATE_DIR": str(home / "state"),
        "VM_PARAMS_DIR": str(home / "params"),
        "VM_C1_PATH": str(c1),
        "VM_CUZK_BIN": console_script("vm-sim-cuzk"),
        "VM_CUZK_BENCH_BIN": console_script("vm-sim-cuzk-bench"),
        "VM_NVML": "sim",
        "VM_SIM_PROFILE": orjson.dumps(instance_profile(offer)).decode(),
        "VM_SIM_TIME_SCALE": str(time_scale),
        "VM_SIM_STATE_FILE": str(home / "sim-state.json"),
        # Simulated time runs time_scale times faster, so sample faster too, or a
        # whole benchmark would fit between two samples.
        "VM_SAMPLE_INTERVAL": str(sample_interval_s),
        "PYTHONUNBUFFERED": "1",
    }


def instance_profile(offer: Offer) -> dict[str, object]:
    """The offer as its instance sees the machine: ``cpu_ram`` cut to the instance's share
    (the simulator reads ``cpu_ram`` as the RAM it has; ``cpu_cores_effective`` already
    gives it the instance's cores)."""
    share = instance_share(offer)
    if share.ram_gb is None:
        return dict(offer.raw)
    return {**offer.raw, "cpu_ram": int(share.ram_gb * 1000)}


def matches(offer: Mapping[str, Any], query: dict[str, Any]) -> bool:
    """Evaluate a vast.ai search query (``{field: {op: value}}``) against one offer's JSON."""
    for name, cond in query.items():
        if not isinstance(cond, dict):
            continue  # order, type, limit, allocated_storage: not predicates
        value = offer.get(name)
        for op, want in cond.items():
            if not _holds(op, value, want):
                return False
    return True


def _holds(op: str, value: Any, want: Any) -> bool:
    if op == "eq":
        return bool(value == want)
    if op == "neq":
        return bool(value != want)
    if op in ("in", "notin"):
        inside = value in (want if isinstance(want, list) else [want])
        return inside if op == "in" else not inside
    if value is None:
        return False
    try:
        if op == "gt":
            return bool(value > want)
        if op == "gte":
            return bool(value >= want)
        if op == "lt":
            return bool(value < want)
        if op == "lte":
            return bool(value <= want)
    except TypeError:
        return False
    return True


@dataclass
class _LocalInstance:
    instance_id: int
    offer: Offer
    label: str
    process: subprocess.Popen[bytes]
    workdir: Path
    start_date: float
    log_file: Any = None
    destroyed: bool = False
    extra: dict[str, Any] = field(default_factory=dict)


class LocalProvider:
    """The local simulated fleet (see module docstring)."""

    name = "local"

    def __init__(
        self,
        workdir: Path,
        *,
        time_scale: float = 200.0,
        offers: list[dict[str, Any]] | None = None,
        agent_env: dict[str, str] | None = None,
        param_rate_scale: float = 1.0,
        sample_interval_s: float = 0.1,
    ) -> None:
        self.workdir = Path(workdir)
        self.time_scale = time_scale
        # The catalog as vast.ai's JSON; each search parses it (coordinator.offers).
        self.offers: dict[int, dict[str, Any]] = {
            o["id"]: o for o in (offers or catalog_offers())}
        self.agent_env = dict(agent_env or {})
        self.param_rate_scale = param_rate_scale
        self.sample_interval_s = sample_interval_s
        self._instances: dict[int, _LocalInstance] = {}
        self._next_id = 700001
        self._lock = asyncio.Lock()
        self._files: dict[str, bytes] = {}
        self._runner: web.AppRunner | None = None
        self._files_url: str | None = None
        self._token = os.urandom(6).hex()

    # --- offers --------------------------------------------------------------

    def _rented(self, offer_id: int) -> bool:
        return any(
            i.offer.id == offer_id and not i.destroyed for i in self._instances.values()
        )

    async def search_offers(self, filter_text: str | None = None) -> list[Offer]:
        query: dict[str, Any] = {}
        if filter_text:
            from vast_manager.coordinator.providers.vast.filters import parse_filter

            query = parse_filter(filter_text)
        out = []
        for offer in self.offers.values():
            shown = dict(offer, rented=self._rented(offer["id"]))
            shown["rentable"] = not shown["rented"]
            if shown["rentable"] and matches(shown, query):
                out.append(shown)
        return parse_offers(out, source="local catalog")

    async def get_offer(self, offer_id: int) -> Offer | None:
        offer = self.offers.get(offer_id)
        if offer is None or self._rented(offer_id):
            return None
        found = parse_offers([dict(offer, rentable=True, rented=False)], source="local catalog")
        return found[0] if found else None

    # --- parameter file server -----------------------------------------------

    async def _ensure_file_server(self) -> str:
        if self._files_url is not None:
            return self._files_url
        for name, size in PARAM_FILES:
            # Deterministic content so a resumed download verifies.
            seed = hashlib.sha256(name.encode()).digest()
            self._files[name] = (seed * (size // len(seed) + 1))[:size]
        app = web.Application()
        app.router.add_get("/params/{name}", self._serve_file)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self._files_url = f"http://127.0.0.1:{port}"
        return self._files_url

    async def _serve_file(self, request: web.Request) -> web.StreamResponse:
        name = request.match_info["name"]
        data = self._files.get(name)
        if data is None:
            raise web.HTTPNotFound(text='{"error": "not_found", "message": "No such file."}')
        start = 0
        rng = request.headers.get("Range", "")
        if rng.startswith("bytes=") and rng[6:].split("-")[0].isdigit():
            start = min(int(rng[6:].split("-")[0]), len(data))
        status = 206 if start else 200
        resp = web.StreamResponse(status=status)
        resp.content_length = len(data) - start
        if start:
            resp.headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
        await resp.prepare(request)
        # Pace the download as the host's bandwidth would, scaled like the rest
        # of the simulation: 45 GiB of real parameters over inet_down Mbit/s.
        rate_mbps = float(request.query.get("mbps", "1000"))
        real_bytes_total = 45 * 1024**3
        seconds_real_download = real_bytes_total * 8 / (rate_mbps * 1e6)
        sim_seconds = seconds_real_download / self.time_scale * self.param_rate_scale
        total = sum(len(v) for v in self._files.values())
        chunk = 64 * 1024
        delay = sim_seconds * chunk / total
        for pos in range(start, len(data), chunk):
            await resp.write(data[pos : pos + chunk])
            await asyncio.sleep(min(delay, 0.5))
        await resp.write_eof()
        return resp

    def _manifest(self, base_url: str, offer: Offer, path: Path) -> Path:
        mbps = f"{offer.inet_down or 1000:g}"
        entries = [
            {
                "name": name,
                "url": f"{base_url}/params/{name}?mbps={mbps}",
                "size": len(self._files[name]),
                "sha256": hashlib.sha256(self._files[name]).hexdigest(),
            }
            for name, _ in PARAM_FILES
        ]
        path.write_bytes(orjson.dumps(entries))
        return path

    # --- instances -------------------------------------------------------------

    async def create_instance(
        self, offer: Offer, *, label: str, env: dict[str, str], disk_gb: int
    ) -> CreatedInstance:
        async with self._lock:
            listed = self.offers.get(offer.id) if offer.id is not None else None
            if listed is None or offer.id is None or self._rented(offer.id):
                raise OfferGone(f"offer {offer.id} is no longer available")
            current = parse_offer(listed)
            files_url = await self._ensure_file_server()
            instance_id = self._next_id
            self._next_id += 1
            workdir = self.workdir / f"instance-{instance_id}"
            child_env = agent_environment(os.environ)
            child_env.update(self.agent_env)
            child_env.update(env)
            child_env.update(
                simulated_machine_env(workdir, current, self.time_scale, self.sample_interval_s)
            )
            manifest = self._manifest(files_url, current, workdir / "params-manifest.json")
            child_env.update({"VM_PARAMS_MANIFEST": str(manifest), "VM_PROVIDER": "local",
                              # The simulated cuzk-bench is Python: unbuffered, it streams
                              # its lines as the real one does, whatever the shell set.
                              "PYTHONUNBUFFERED": "1"})
            # A local instance has no vast.ai identity; never pass one on.
            child_env.pop("CONTAINER_API_KEY", None)
            # Every process under this agent inherits the marker, so destroy finds
            # them all even if one was re-parented after its parent died.
            child_env[MARKER_ENV] = f"{self._token}:{instance_id}"
            log_file = (workdir / "agent.log").open("ab")
            process = subprocess.Popen(
                [sys.executable, "-m", "vast_manager.sim.agent_run", "run"],
                env=child_env,
                cwd=workdir,
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            self._instances[instance_id] = _LocalInstance(
                instance_id, current, label, process, workdir, time.time(), log_file
            )
            log.info("local instance %s started for offer %s", instance_id, offer.id)
            return CreatedInstance(instance_id, f"simulated local instance {instance_id}")

    async def destroy_instance(self, instance_id: int) -> None:
        inst = self._instances.get(instance_id)
        if inst is None or inst.destroyed:
            return
        inst.destroyed = True
        await asyncio.to_thread(_stop_tree, inst.process, f"{self._token}:{instance_id}")
        if inst.log_file is not None:
            inst.log_file.close()

    async def list_instances(self) -> list[ProviderInstance]:
        out = []
        for inst in self._instances.values():
            if inst.destroyed:
                continue
            alive = inst.process.poll() is None
            out.append(
                {
                    "id": inst.instance_id,
                    "label": inst.label,
                    "machine_id": inst.offer.raw["machine_id"],
                    "host_id": inst.offer.raw["host_id"],
                    "actual_status": "running" if alive else "exited",
                    "intended_status": "running",
                    "start_date": inst.start_date,
                    "gpu_name": inst.offer.raw["gpu_name"],
                    "num_gpus": inst.offer.raw["num_gpus"],
                    "dph_total": inst.offer.raw["dph_total"],
                    "geolocation": inst.offer.raw["geolocation"],
                }
            )
        return out

    def agent_log_path(self, instance_id: int) -> Path | None:
        inst = self._instances.get(instance_id)
        return inst.workdir / "agent.log" if inst else None

    async def close(self) -> None:
        # In parallel: each destroy may wait out an agent's SIGTERM grace.
        await asyncio.gather(*(self.destroy_instance(i) for i in list(self._instances)))
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    def kill_all_now(self) -> None:
        """Synchronous last resort (atexit, second Ctrl-C): no process is left behind."""
        for inst in self._instances.values():
            if inst.process.poll() is None or not inst.destroyed:
                _stop_tree(inst.process, f"{self._token}:{inst.instance_id}", grace_s=0.5)
                inst.destroyed = True


def marked_processes(marker: str) -> list[psutil.Process]:
    """Processes whose environment carries this instance's marker."""
    found = []
    for p in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if p.environ().get(MARKER_ENV) == marker:
                found.append(p)
    return found


def _stop_tree(
    process: subprocess.Popen[bytes], marker: str, grace_s: float = STOP_GRACE_S
) -> None:
    """SIGTERM the agent and everything it started, then SIGKILL what is left."""
    procs: dict[int, psutil.Process] = {}
    with contextlib.suppress(psutil.NoSuchProcess):
        root = psutil.Process(process.pid)
        procs = {p.pid: p for p in [root, *root.children(recursive=True)]}
    procs.update({p.pid: p for p in marked_processes(marker)})
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGTERM)
    for p in procs.values():
        with contextlib.suppress(psutil.Error):
            p.terminate()
    _, alive = psutil.wait_procs(list(procs.values()), timeout=grace_s)
    for p in alive:
        with contextlib.suppress(psutil.Error):
            p.kill()
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
    psutil.wait_procs(alive, timeout=2)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=2)
