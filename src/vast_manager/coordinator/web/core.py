"""What every handler shares: one ``Core`` object under one typed ``web.AppKey``."""

from __future__ import annotations

from dataclasses import dataclass

from aiohttp import web

from vast_manager.coordinator.decisions import policy
from vast_manager.coordinator.operations.autopilot_loop import Autopilot
from vast_manager.coordinator.operations.deploy import Deployer
from vast_manager.coordinator.operations.model_keeper import ModelKeeper
from vast_manager.coordinator.operations.monitor import HeartbeatTracker, Monitor
from vast_manager.coordinator.providers.base import Provider
from vast_manager.coordinator.settings import Settings
from vast_manager.coordinator.store.writer import Store
from vast_manager.coordinator.web.auth import (
    AgentAuth,
)
from vast_manager.coordinator.web.guard import Guard


@dataclass(slots=True)
class Core:
    """Everything the handlers share (one object under one AppKey; no module globals)."""

    settings: Settings
    store: Store
    provider: Provider
    clock: policy.Clock
    auth: AgentAuth
    tracker: HeartbeatTracker
    monitor: Monitor
    deployer: Deployer
    guard: Guard
    started_at: float  # when this process started watching (its clock)
    models: ModelKeeper  # the rate model's latest fit (docs/discovery.md)
    autopilot: Autopilot


CORE = web.AppKey("core", Core)
