"""A tiny in-memory Provider and a settable clock for the coordinator tests."""

from __future__ import annotations

from typing import Any

from vast_manager.coordinator.offers import parse_offer, parse_offers
from vast_manager.coordinator.providers.base import CreatedInstance, Offer, OfferGone, ProviderError


class FakeClock:
    """Unix seconds that move only when a test says so."""

    def __init__(self, start: float = 1_800_000_000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> float:
        self.now += seconds
        return self.now


def offer(
    offer_id: int,
    machine_id: int,
    *,
    dph_total: float = 0.40,
    num_gpus: int = 1,
    gpu_name: str = "RTX 4090",
) -> dict[str, Any]:
    """An offer's JSON in vast.ai's shape (the provider parses it, as vast.ai's)."""
    return {
        "id": offer_id,
        "machine_id": machine_id,
        "gpu_name": gpu_name,
        "num_gpus": num_gpus,
        "dph_total": dph_total,
        "geolocation": "Quebec, CA",
        "cpu_name": "AMD EPYC 7K62",
        "cpu_cores": 48,
        "cpu_cores_effective": 48.0,  # the whole host: its instance gets all 257 GB
        "cpu_ram": 257000,
        "pcie_bw": 24.5,
    }


class FakeProvider:
    """Records every call; offers, instances and failures are set by the test."""

    name = "fake"

    def __init__(self, offers: list[dict[str, Any]] | None = None) -> None:
        self.offers: dict[int, dict[str, Any]] = {o["id"]: o for o in (offers or [])}
        self.created: list[dict[str, Any]] = []
        self.destroyed: list[int] = []
        self.instances: dict[int, dict[str, Any]] = {}
        self.create_error: ProviderError | None = None
        self.destroy_error: ProviderError | None = None
        self.searched: list[str | None] = []
        self._next_id = 5000

    async def search_offers(self, filter_text: str | None = None) -> list[Offer]:
        self.searched.append(filter_text)
        return parse_offers(self.offers.values(), source="fake provider")

    async def get_offer(self, offer_id: int) -> Offer | None:
        found = self.offers.get(offer_id)
        return parse_offer(found) if found is not None else None

    async def create_instance(
        self, offer: Offer, *, label: str, env: dict[str, str], disk_gb: int
    ) -> CreatedInstance:
        if self.create_error is not None:
            raise self.create_error
        if offer.id not in self.offers:
            raise OfferGone(f"offer {offer.id} is gone")
        self._next_id += 1
        self.created.append(
            {
                "offer": offer,
                "label": label,
                "env": env,
                "disk_gb": disk_gb,
                "instance_id": self._next_id,
            }
        )
        self.instances[self._next_id] = {
            "id": self._next_id,
            "label": label,
            "machine_id": offer.raw["machine_id"],
            "actual_status": "running",
            "start_date": 0.0,
        }
        return CreatedInstance(self._next_id, f"fake instance {self._next_id}")

    async def destroy_instance(self, instance_id: int) -> None:
        if self.destroy_error is not None:
            raise self.destroy_error
        self.destroyed.append(instance_id)
        self.instances.pop(instance_id, None)

    async def list_instances(self) -> list[dict[str, Any]]:
        return list(self.instances.values())

    async def close(self) -> None:
        return None
