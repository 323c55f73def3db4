"""A simulated host probe: `vast_manager.agent.host.HostSource` fed by the simulation.

Facts come from the hardware profile (VM_SIM_PROFILE); CPU, load, iowait and
RAM come from the state file the simulated cuzk daemon writes, so a host the
simulation makes CPU-bound looks CPU-bound to the sampler. Idle values when
no daemon writes.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Callable

from vast_manager.agent.host import DiskUsage, HostFacts, HostSample, MemoryLimit, existing_dir
from vast_manager.sim.fake_nvml import SimStateReader
from vast_manager.sim.hardware import ENV_STATE_FILE, Profile, load_profile

# Background traffic of an idle agent (heartbeats, logs), bytes per second.
_IDLE_NET_RX_BPS = 2_000.0
_IDLE_NET_TX_BPS = 3_000.0


class FakeHostProbe:
    """Same interface as `vast_manager.agent.host.HostProbe`."""

    def __init__(
        self,
        params_dir: str,
        profile: Profile | None = None,
        state_file: str | None = None,
        *,
        reader: SimStateReader | None = None,
        environ: dict[str, str] | None = None,
        noise: bool = True,
        seed: int | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        env = os.environ if environ is None else environ
        if reader is None:
            prof = profile if profile is not None else load_profile(dict(env))
            path = state_file if state_file is not None else env.get(ENV_STATE_FILE)
            reader = SimStateReader(prof, path, wall_clock=wall_clock)
        self.reader = reader
        self.profile = reader.profile
        self.params_dir = params_dir
        self.noise = noise
        self.clock = clock
        self._rng = random.Random(seed)
        self._t0 = clock()

    def facts(self) -> HostFacts:
        p = self.profile
        return HostFacts(
            hostname=f"sim-{p.machine_id}" if p.machine_id else "sim-host",
            cpu_model=p.cpu_name[:255],
            cpu_cores_logical=p.cpu_cores,
            cpu_cores_physical=max(1, p.cpu_cores // 2),  # SMT on, as on most rentals
            ram_total_bytes=p.ram_total_bytes,
        )

    def _per_core(self, util: float) -> list[float]:
        # Spread the mean over the cores the way a busy box looks: each core
        # near the mean, a little scatter, clamped to 0..100.
        if not self.noise:
            return [round(util, 1)] * self.profile.cpu_cores
        gauss = self._rng.gauss
        return [
            round(min(100.0, max(0.0, util + gauss(0.0, 3.0))), 1)
            for _ in range(self.profile.cpu_cores)
        ]

    def sample(self) -> HostSample:
        state = self.reader.state()
        cpu, ram = state.cpu, state.ram
        util = float(cpu.get("util_pct") or 0.0)
        per_core_raw = cpu.get("per_core_util_pct")
        if isinstance(per_core_raw, list) and per_core_raw:
            per_core = [float(v) for v in per_core_raw]
        else:
            per_core = self._per_core(util)
        now = self.clock()
        elapsed = max(0.0, now - self._t0)
        used = ram.get("used_bytes")
        total = ram.get("total_bytes") or self.profile.ram_total_bytes
        load1 = cpu.get("load1")
        iowait = cpu.get("iowait_pct")
        return HostSample(
            t=now,
            cpu_util_pct=util,
            per_core_util_pct=per_core,
            iowait_pct=float(iowait) if iowait is not None else None,
            load1=float(load1) if load1 is not None else None,
            ram_used_bytes=int(used) if used is not None else None,
            ram_total_bytes=int(total),
            net_rx_bytes=int(elapsed * _IDLE_NET_RX_BPS),
            net_tx_bytes=int(elapsed * _IDLE_NET_TX_BPS),
            quota_cores=float(self.profile.cpu_cores),
        )

    def memory_limit(self) -> MemoryLimit:
        """The simulated container's MemTotal and cgroup limit (the profile's)."""
        return MemoryLimit(self.profile.mem_total_bytes, self.profile.memory_limit_bytes)

    def disk_usage(self) -> DiskUsage | None:
        """The real file system under the (simulated) parameter folder."""
        path = existing_dir(self.params_dir)
        try:
            st = os.statvfs(path)
        except OSError:
            return None
        total = st.f_blocks * st.f_frsize
        free = st.f_bavail * st.f_frsize
        return DiskUsage(path, total, total - st.f_bfree * st.f_frsize, free)
