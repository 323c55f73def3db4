"""The composition root: builds the coordinator's core and runs its loops.

``Runtime`` is the one place that constructs the core (the store it is given or opens,
the heartbeat tracker, the monitor and its account watch, the deployer, the rate model's
keeper, the autopilot) and the one place that starts background tasks: the monitor
round, the model's refits, the autopilot, and whatever the serving side hands to
``spawn`` (the HTTP server's head deadline). ``web/`` only serves a runtime
(``web.app.serve``); ``vast-manager serve`` and ``demo`` both reach it through
``web.server.start_server`` (docs/architecture.md, "Layout": the rule of the rooms).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any

from vast_manager.coordinator.decisions import policy
from vast_manager.coordinator.decisions.pace import HeartbeatTracker, RandomSource
from vast_manager.coordinator.operations.account import Account
from vast_manager.coordinator.operations.autopilot_loop import Autopilot
from vast_manager.coordinator.operations.cluster import ClusterWatch
from vast_manager.coordinator.operations.deploy import Deployer
from vast_manager.coordinator.operations.model_keeper import ModelKeeper
from vast_manager.coordinator.operations.monitor import Monitor, account_watch
from vast_manager.coordinator.operations.offer_cache import OfferCache
from vast_manager.coordinator.operations.replay import SpoolMarks
from vast_manager.coordinator.providers.base import Provider
from vast_manager.coordinator.settings import Settings
from vast_manager.coordinator.store.replica import ReplicaHealth, Replicator
from vast_manager.coordinator.store.writer import Store

log = logging.getLogger(__name__)


class Runtime:
    """The coordinator's core, built once, and the tasks that run it.

    ``rng`` draws the heartbeat jitter (``decisions.pace``); tests inject a seeded one so
    every answer is reproducible. ``clock`` is the one clock every part reads."""

    def __init__(
        self,
        settings: Settings,
        store: Store,
        provider: Provider,
        clock: policy.Clock = time.time,
        *,
        rng: RandomSource | None = None,
        owns_store: bool = False,
    ) -> None:
        # Whole seconds: signed timestamps at or before this second are refused after a
        # restart (``protocol.nonces``), and the store's first reads see the same second.
        self.started_second = int(clock())
        self.started_at = float(self.started_second)
        self.settings = settings
        self.store = store
        self.provider = provider
        self.clock = clock
        self.rng: RandomSource = rng if rng is not None else random.Random()
        self.tracker = HeartbeatTracker(settings.silence_grace_s, settings.next_heartbeat_s)
        self._revoked_listeners: list[Callable[[str], None]] = []
        self.account: Account = account_watch(provider, settings)
        self.cluster = ClusterWatch(settings, clock)
        self.monitor = Monitor(settings, store, provider, clock, self.tracker,
                               on_agent_revoked=self._agent_revoked, account=self.account,
                               cluster=self.cluster)
        self.monitor.seed(clock())
        # One offer cache for the autopilot, the operator's offers and plan, the dashboard
        # and the deploys' re-checks: vast.ai's searches are counted by the day.
        self.offers = OfferCache(provider, settings, clock)
        self.deployer = Deployer(settings, store, provider, clock, destroy=self.monitor.destroy,
                                 account=self.account, offers=self.offers)
        self.models = ModelKeeper(store, clock, settings.model_refit_interval_s)
        self.autopilot = Autopilot(settings, store, provider, self.deployer, self.monitor,
                                   self.models, clock)
        #: Each agent's highest stored spool sequence (``operations.replay``), read at start.
        self.spool_marks = SpoolMarks()
        self._owns_store = owns_store
        #: Litestream beside the database (``store.replica``), when ``replica_url`` is set
        #: and the runtime opened the store itself.
        self.replicator: Replicator | None = None
        self._tasks: list[asyncio.Task[Any]] = []
        self._started = False

    @classmethod
    async def open(
        cls, settings: Settings, provider: Provider, clock: policy.Clock = time.time, *,
        rng: RandomSource | None = None,
    ) -> Runtime:
        """Open ``settings.db_path`` (on a thread: a migration may take a while) and build
        the core on it; ``stop`` closes the store."""
        store = await asyncio.to_thread(Store, settings.db_path,
                                        batch_max=settings.write_batch_max,
                                        commit_window_s=settings.commit_window_ms / 1000)
        try:
            runtime = cls(settings, store, provider, clock, rng=rng, owns_store=True)
            if settings.replica_url:
                runtime.replicator = Replicator(settings.db_path, settings.replica_url, clock)
                await runtime.replicator.start()
                log.info("replicating %s to %s", settings.db_path, settings.replica_url)
            else:
                log.warning("the fleet's state is on one disk (%s): set VM_REPLICA_URL to "
                            "replicate it (docs/operations.md, \"Losing the coordinator\")",
                            settings.db_path)
            runtime.deployer.durable = runtime.durable
            return runtime
        except BaseException:
            await asyncio.to_thread(store.close)
            raise

    def replica_health(self) -> ReplicaHealth:
        """The replication's health (``configured`` False without ``replica_url``)."""
        if self.replicator is None:
            return ReplicaHealth(configured=False)
        return self.replicator.health()

    async def durable(self) -> None:
        """Return once every committed write is in the replica (at once without one)."""
        if self.replicator is not None:
            await self.replicator.durable()

    # --- who else hears of the core's decisions ---------------------------------------

    def on_agent_revoked(self, listener: Callable[[str], None]) -> None:
        """Call ``listener(agent_id)`` whenever the monitor revokes an agent (the web's
        request verification forgets its keys)."""
        self._revoked_listeners.append(listener)

    def _agent_revoked(self, agent_id: str) -> None:
        for listener in self._revoked_listeners:
            listener(agent_id)

    # --- the loops ------------------------------------------------------------------

    def spawn(self, coro: Coroutine[Any, Any, Any], name: str) -> asyncio.Task[Any]:
        """Run ``coro`` in the background until ``stop`` (every task of the process is
        started here, so one ``stop`` ends them all)."""
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.append(task)
        return task

    async def start(self, *, loops: bool = True) -> None:
        """Say what the autopilot will do, then (``loops``) start the monitor, the
        refits and the autopilot. Without loops, tests drive ``monitor.tick()`` and
        ``autopilot.tick()`` with an injected clock."""
        self._started = True
        await self.spool_marks.load(self.store)
        line = await self.autopilot.start_up()
        if self.autopilot.configured:
            log.warning("%s", line)
        if self.replicator is not None:
            self.spawn(self.replicator.watch(), "coordinator-replica")
        if loops:
            self.spawn(self.monitor.run(), "coordinator-monitor")
            self.spawn(self.models.run(), "coordinator-rate-model")
            if self.cluster.configured:
                # Its own task: a slow cluster database never holds a monitor round.
                self.spawn(self.cluster.run(), "coordinator-cluster-read")
            if self.autopilot.configured:
                self.spawn(self.autopilot.run(), "coordinator-autopilot")

    async def stop(self) -> None:
        """End every task, the rate model's worker, and the store when it was opened here."""
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self.models.close()  # the rate model's worker process, if one was started
        await self.cluster.close()
        if self._owns_store:
            await asyncio.to_thread(self.store.close)
        if self.replicator is not None:
            # After the store: the last writes are committed, and Litestream's shutdown
            # sync carries them to the replica.
            await self.replicator.stop()

    def hosted(self, *, loops: bool) -> Callable[[object], AsyncIterator[None]]:
        """``start`` and ``stop`` as one context for a host's lifecycle (aiohttp's
        ``cleanup_ctx`` in ``web.app.create_app``, the tests' and benches' one call)."""

        async def lifespan(_host: object) -> AsyncIterator[None]:
            await self.start(loops=loops)
            try:
                yield
            finally:
                await self.stop()

        return lifespan
