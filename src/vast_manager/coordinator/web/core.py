"""What every handler shares: one ``Core`` object under one typed ``web.AppKey``.

The core itself is built by the runtime (``coordinator.runtime``); ``Core`` is the web's
view of it, plus the two things only the web has: request verification (``auth``) and
the guard of the open port (``guard``)."""

from __future__ import annotations

from aiohttp import web

from vast_manager.coordinator.decisions import policy
from vast_manager.coordinator.decisions.pace import HeartbeatTracker, RandomSource
from vast_manager.coordinator.operations.autopilot_loop import Autopilot
from vast_manager.coordinator.operations.deploy import Deployer
from vast_manager.coordinator.operations.model_keeper import ModelKeeper
from vast_manager.coordinator.operations.monitor import Monitor
from vast_manager.coordinator.operations.offer_cache import OfferCache
from vast_manager.coordinator.operations.replay import SpoolMarks
from vast_manager.coordinator.providers.base import Provider
from vast_manager.coordinator.runtime import Runtime
from vast_manager.coordinator.settings import Settings
from vast_manager.coordinator.store.writer import Store
from vast_manager.coordinator.web.auth import AgentAuth
from vast_manager.coordinator.web.guard import Guard


class Core:
    """Everything the handlers share (one object under one AppKey; no module globals).

    The runtime's parts are copied to attributes once: a heartbeat reads several of
    them, and an attribute is the cheapest read."""

    __slots__ = (
        "auth",
        "autopilot",
        "clock",
        "deployer",
        "guard",
        "models",
        "monitor",
        "offers",
        "provider",
        "rng",
        "runtime",
        "settings",
        "spool_marks",
        "started_at",
        "store",
        "tracker",
    )

    def __init__(self, runtime: Runtime, auth: AgentAuth, guard: Guard) -> None:
        self.runtime = runtime
        self.auth = auth
        self.guard = guard
        self.settings: Settings = runtime.settings
        self.store: Store = runtime.store
        self.provider: Provider = runtime.provider
        self.clock: policy.Clock = runtime.clock
        self.rng: RandomSource = runtime.rng
        self.tracker: HeartbeatTracker = runtime.tracker
        self.monitor: Monitor = runtime.monitor
        self.deployer: Deployer = runtime.deployer
        self.models: ModelKeeper = runtime.models  # the rate model's latest fit
        self.autopilot: Autopilot = runtime.autopilot
        self.offers: OfferCache = runtime.offers
        self.started_at: float = runtime.started_at  # when this process started watching
        self.spool_marks: SpoolMarks = runtime.spool_marks  # docs/protocol.md, "Replay"


CORE = web.AppKey("core", Core)
