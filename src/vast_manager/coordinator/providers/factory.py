"""The provider named on the command line, built from the settings."""

from __future__ import annotations

from pathlib import Path

from vast_manager.coordinator.providers.base import Provider
from vast_manager.coordinator.settings import Settings


def make_provider(settings: Settings, provider_name: str) -> Provider:
    """Build the provider named on the command line (imports only the one needed)."""
    if provider_name == "local":
        from vast_manager.coordinator.providers.local.provider import LocalProvider

        workdir = Path(settings.db_path).resolve().parent / "local-instances"
        return LocalProvider(workdir)  # type: ignore[return-value]
    if provider_name == "vast":
        from vast_manager.coordinator.providers.vast.provider import from_settings

        # The REST client (API key found as the official CLI finds it, VAST_URL),
        # the image, the onstart script and the rest of VM_VAST_*; a missing key
        # or image is a ProviderConfigError (a ValueError) naming what to set.
        return from_settings(settings)
    if provider_name == "fake":
        from vast_manager.coordinator.providers.fake import fake_provider

        # The project's fake vast.ai in this process, for rehearsals (docs/operations.md).
        return fake_provider(settings)
    raise ValueError(f"unknown provider {provider_name!r} (local, vast or fake)")
