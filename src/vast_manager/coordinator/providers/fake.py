"""``vast-manager serve --provider fake``: the vast provider, unchanged, talking to the
project's stateful fake vast.ai (``providers.fakevast``) run in this process.

Everything the coordinator does on vast.ai it does here over HTTP on loopback: searches
(on the daily quota), creates, lists, destroys, price increases, bids, reports. Each
instance runs a real agent on the simulated cuzk (``SimAgents``), so its rates are
simulated. The operator injects vast.ai's faults through ``vast-manager fake ...``
(``web.fake_api``) to rehearse the drills of docs/operations.md before spending money.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from vast_manager.coordinator.providers.fakevast import FAKE_API_KEY, FakeVast, SimAgents
from vast_manager.coordinator.providers.local.catalog import catalog_offers
from vast_manager.coordinator.providers.vast.client import VastClient
from vast_manager.coordinator.providers.vast.provider import DEFAULT_ONSTART, VastProvider
from vast_manager.coordinator.settings import Settings

#: The image name the fake's creates carry (the fake runs the agent from this package).
FAKE_IMAGE = "vast-manager/agent:fake"
#: Simulated seconds per real second of the fake's instances.
FAKE_TIME_SCALE = 60.0
#: The default filter of the vast provider asks verified hosts with a large share; the
#: fake's catalogue is the local provider's, so every offer of it is listed.
FAKE_FILTER = "rentable=true"


class FakeVastProvider(VastProvider):
    """The vast provider on an in-process fake vast.ai (``start`` before use)."""

    name = "fake"

    def __init__(self, fake: FakeVast, settings: Settings, *, time_scale: float) -> None:
        client = VastClient(fake.api_key, "http://127.0.0.1:9", key_source="the fake vast.ai")
        super().__init__(client, image=settings.vast_image or FAKE_IMAGE,
                         onstart=DEFAULT_ONSTART, disk_gb=settings.deploy_disk_gb,
                         default_filter=settings.vast_filter or FAKE_FILTER)
        self.fake = fake
        self.time_scale = time_scale

    async def start(self) -> None:
        """Listen on loopback and point the client there."""
        await self.fake.__aenter__()
        self.client.base_url = self.fake.url

    async def close(self) -> None:
        await super().close()
        await self.fake.__aexit__(None, None, None)


def fake_provider(settings: Settings, *, time_scale: float = FAKE_TIME_SCALE,
                  **fake_options: Any) -> FakeVastProvider:
    """A fake vast.ai that loads, bills (simulated dollars) and runs agents, its
    catalogue the local provider's hosts; ``fake_options`` set its switches."""
    workdir = Path(settings.db_path).resolve().parent / "fake-vast-instances"
    workdir.mkdir(parents=True, exist_ok=True)
    fake = FakeVast(api_key=FAKE_API_KEY, launcher=SimAgents(workdir, time_scale=time_scale),
                    loading=True, **fake_options)
    for offer in catalog_offers():
        fake.add_offer(int(offer.pop("id")), int(offer.pop("machine_id")), **offer)
    return FakeVastProvider(fake, settings, time_scale=time_scale)
