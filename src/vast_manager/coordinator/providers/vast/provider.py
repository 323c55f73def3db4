"""VastProvider: the Provider interface on vast.ai, through ``providers.vast.client.VastClient``.

Offers come from the official CLI's query syntax (``coordinator.providers.vast.filters``);
create sends the keys ``vastai create instance`` sends. The deploy checks
(bad host, busy machine, price ceiling, serialization) live in
``vast_manager.coordinator.operations.deploy``, not here.
"""

from __future__ import annotations

import base64
import gzip
import json
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vast_manager.coordinator.offers import parse_offers
from vast_manager.coordinator.providers.base import (
    CreatedInstance,
    Offer,
    OfferGone,
    ProviderError,
    ProviderInstance,
)
from vast_manager.coordinator.providers.vast.client import (
    DEFAULT_BASE_URL,
    OutcomeUnknown,
    VastClient,
    find_api_key,
)
from vast_manager.coordinator.providers.vast.filters import (
    DEFAULT_FILTER,
    DEFAULT_ORDER,
    apply_local_filters,
    build_search_query,
)
from vast_manager.coordinator.settings import DEFAULTS

if TYPE_CHECKING:
    from vast_manager.coordinator.settings import Settings

log = logging.getLogger(__name__)

#: vast.ai's limit on the ``onstart`` field, in characters ("gzip+base64 for longer
#: scripts": the OpenAPI description's quirks, docs/vast.md).
MAX_ONSTART_CHARS = 4048
#: The CLI's ``--ssh --direct``: vast.ai runs the onstart script instead of the
#: image's ENTRYPOINT. ``"args"`` runs the image's ENTRYPOINT instead.
DEFAULT_RUNTYPE = DEFAULTS.vast_runtype
#: The onstart script of the vast.ai template (image/vast-template.md): it starts
#: the agent's supervisor baked into the image and returns.
DEFAULT_ONSTART = (
    "#!/bin/bash\n"
    "# Start (or leave running) the vast-agent supervisor baked into the image.\n"
    "/usr/local/bin/vast-agent-onstart start\n"
)

# Instance fields that carry credentials (our agent key sits in extra_env and
# may sit in onstart); they never leave this module.
_SECRET_INSTANCE_FIELDS = frozenset(
    {"extra_env", "onstart", "instance_api_key", "jupyter_token", "ssh_key", "image_login"}
)


class VastProvider:
    """Rents, lists and destroys vast.ai instances for the coordinator."""

    name = "vast"

    def __init__(
        self,
        client: VastClient,
        *,
        image: str,
        onstart: str,
        disk_gb: int = 250,
        extra_env: Mapping[str, str] | None = None,
        runtype: str = DEFAULT_RUNTYPE,
        image_login: str | None = None,
        default_filter: str = DEFAULT_FILTER,
        order: str = DEFAULT_ORDER,
        search_limit: int | None = None,
    ) -> None:
        if not image:
            raise ValueError("a container image is required")
        if disk_gb <= 0:
            raise ValueError("disk_gb must be positive")
        self.client = client
        self.image = image
        self.onstart = fit_onstart(onstart)
        self.disk_gb = disk_gb
        self.extra_env = {str(k): str(v) for k, v in (extra_env or {}).items()}
        self.runtype = runtype
        self.image_login = image_login
        self.default_filter = default_filter
        self.order = order
        self.search_limit = search_limit

    async def search_offers(self, filter_text: str | None = None) -> list[Offer]:
        """Offers matching ``filter_text`` (None: the original manager's filter), priced
        with our default disk size (``allocated_storage``) so ``dph_total`` is what we pay.
        """
        query = build_search_query(
            self.default_filter if filter_text is None else filter_text,
            order=self.order,
            limit=self.search_limit,
            storage_gb=self.disk_gb,
        )
        offers = apply_local_filters(await self.client.search_offers(query), query)
        return parse_offers((_normalize_offer(o, self.disk_gb) for o in offers),
                            source="vast.ai search")

    async def get_offer(self, offer_id: int) -> Offer | None:
        """Re-read one offer now: a search for this id that is rentable and not rented.

        No default verified/external conditions: an offer the operator picked with
        ``verified=any`` must still be found.
        """
        query = build_search_query(
            f"id={int(offer_id)} rentable=true rented=false",
            no_default=True,
            storage_gb=self.disk_gb,
        )
        for offer in apply_local_filters(await self.client.search_offers(query), query):
            if _as_int(offer.get("id")) != int(offer_id):
                continue
            if offer.get("rentable") is False or offer.get("rented") is True:
                return None
            found = parse_offers([_normalize_offer(offer, self.disk_gb)], source="vast.ai offer")
            return found[0] if found else None
        return None

    #: vast.ai rents interruptible instances at a bid (``price``); the deployer asks.
    supports_bids = True

    def create_body(self, *, label: str, env: Mapping[str, str], disk_gb: int,
                    bid_per_hour: float | None = None) -> dict[str, Any]:
        """The JSON ``vastai create instance`` PUTs to /api/v0/asks/{id}/ (vast-cli
        ``vast.py`` 01163020 ``create__instance``; ``vastai/api/instances.py``).
        """
        merged_env = dict(self.extra_env)
        # The agent's own VM_* values win over operator-wide extras.
        merged_env.update({str(k): str(v) for k, v in env.items()})
        args_mode = self.runtype == "args"
        return {
            "client_id": "me",
            "image": self.image,
            "env": merged_env,
            # None: on-demand; a number: an interruptible instance at this bid, $/hour per
            # machine (vast-cli ``create instance --bid_price``).
            "price": None if bid_per_hour is None else round(float(bid_per_hour), 6),
            "disk": float(disk_gb),
            "label": label,
            "extra": None,
            # In args mode the CLI sends onstart as the ENTRYPOINT override, so
            # sending our script there would replace the image's entrypoint.
            "onstart": None if args_mode else self.onstart,
            "image_login": self.image_login,
            "python_utf8": False,
            "lang_utf8": False,
            "use_jupyter_lab": False,
            "jupyter_dir": None,
            "force": False,
            # Without it vast.ai may create a *stopped* instance when the host
            # cannot schedule it: storage bills, nothing runs. Fail instead.
            "cancel_unavail": True,
            "template_hash_id": None,
            "user": None,
            "runtype": self.runtype,
        }

    async def create_instance(
        self, offer: Offer, *, label: str, env: dict[str, str], disk_gb: int,
        bid_per_hour: float | None = None,
    ) -> CreatedInstance:
        """Rent ``offer``. OfferGone when it was sold meanwhile; CreateFailed (with the
        instance's id) when vast.ai refused but made an instance; other ProviderErrors
        when vast.ai refused or the outcome is unknown (the label then finds it)."""
        offer_id = offer.id
        if offer_id is None:
            raise ProviderError("offer without an id")
        body = self.create_body(label=label, env=env, disk_gb=disk_gb, bid_per_hour=bid_per_hour)
        log.info(
            "vast.ai create on offer %s (machine %s) label %s disk %s GB",
            offer_id,
            offer.machine_id,
            label,
            disk_gb,
        )
        try:
            answer = await self.client.create_instance(offer_id, body)
        except OfferGone:
            log.info("vast.ai offer %s gone at create", offer_id)
            raise
        except OutcomeUnknown as exc:
            # The create may have happened: the label is unique to this
            # deploy's agent, so look for it rather than leak a paid instance.
            found = await self._find_by_label(label)
            if found is None:
                raise
            log.warning("vast.ai create on offer %s: answer lost, found %s", offer_id, found)
            return CreatedInstance(
                instance_id=found,
                message=f"vast.ai instance {found} on offer {offer_id} found by its label "
                f"after the create answer was lost ({exc})",
            )
        instance_id = int(answer["new_contract"])
        return CreatedInstance(
            instance_id=instance_id,
            message=f"created vast.ai instance {instance_id} on offer {offer_id} "
            f"(machine {offer.machine_id}, {offer.num_gpus}x "
            f"{offer.gpu_name}, ${offer.dph_total}/h)",
        )

    async def _find_by_label(self, label: str) -> int | None:
        try:
            rows = await self.client.list_instances()
        except ProviderError:
            return None
        ids = sorted(
            i for i in (_as_int(r.get("id")) for r in rows if r.get("label") == label) if i
        )
        # Two would be a double sale; return the first, reconciliation
        # destroys the other as a duplicate.
        return ids[0] if ids else None

    async def account(self) -> dict[str, Any]:
        """The account's fields, ``balance`` and ``credit`` among them (docs/vast.md)."""
        return await self.client.current_user()

    async def start_instance(self, instance_id: int) -> None:
        """Start a stopped instance again (``vastai start instance``: PUT state running)."""
        await self.client.set_state(instance_id, "running")

    #: vast.ai meters searches (a daily quota, docs/vast.md): the offer cache keeps to
    #: ``VM_VAST_SEARCHES_PER_DAY`` for this provider.
    searches_metered = True

    async def pending_price_increases(self) -> list[dict[str, Any]]:
        """Hosts' pending price increases on our running contracts (docs/vast.md)."""
        return await self.client.pending_price_increases()

    async def answer_price_increase(self, pending_id: int, *, accept: bool) -> None:
        await self.client.answer_price_increase(pending_id, accept=accept)

    async def change_bid(self, instance_id: int, price_per_hour: float) -> None:
        await self.client.change_bid(instance_id, price_per_hour)

    async def machine_reports(self, machine_id: int) -> list[dict[str, Any]]:
        return await self.client.machine_reports(machine_id)

    async def destroy_instance(self, instance_id: int) -> None:
        """Destroy and confirm; idempotent. ``DestroyUnconfirmed`` when vast.ai still
        lists the instance afterwards (the monitor records it and destroys it again)."""
        await self.client.destroy_instance(instance_id)
        log.info("vast.ai instance %s destroyed (confirmed gone)", instance_id)

    async def list_instances(self) -> list[ProviderInstance]:
        """Every instance of the account, without fields that carry credentials."""
        return [public_instance(row) for row in await self.client.list_instances()]

    async def close(self) -> None:
        await self.client.close()


class ProviderConfigError(ValueError):
    """The vast provider cannot be built: no API key, no image, a malformed setting.

    The message names what to set, never a secret's value."""


def from_settings(
    settings: Settings,
    *,
    environ: Mapping[str, str] | None = None,
    home: Path | None = None,
) -> VastProvider:
    """The provider of ``vast-manager serve --provider vast``.

    The account key is found where the official CLI looks (``VAST_API_KEY``,
    ``~/.config/vastai/vast_api_key``, ``~/.vast_api_key``); the base URL is
    ``VAST_URL`` (tests point it at a fake). Image, onstart script, run type,
    extra environment, registry login and default filter come from the
    ``VM_VAST_*`` settings; the disk size (which also prices the offers) from
    ``VM_DEPLOY_DISK_GB``.
    """
    env = os.environ if environ is None else environ
    found = find_api_key(env, Path.home() if home is None else home)
    if found is None:
        raise ProviderConfigError(
            "no vast.ai API key: set VAST_API_KEY, or save the key in "
            "~/.config/vastai/vast_api_key (what `vastai set api-key` writes)"
        )
    if not settings.vast_image:
        raise ProviderConfigError(
            "VM_VAST_IMAGE is not set: the image vast.ai runs (built from image/Dockerfile, "
            "e.g. ghcr.io/you/vast-agent:1.0)"
        )
    extra_env = parse_extra_env(settings.vast_env)
    onstart = settings.vast_onstart or DEFAULT_ONSTART
    if not onstart.endswith("\n"):
        onstart += "\n"
    runtype = (settings.vast_runtype or DEFAULT_RUNTYPE).strip()
    if not settings.public_url:
        log.warning(
            "VM_PUBLIC_URL is not set: agents on vast.ai will be told %s, which they cannot "
            "reach unless it is a public address", settings.coordinator_url,
        )
    key, source = found
    client = VastClient(
        key, (env.get("VAST_URL") or "").strip() or DEFAULT_BASE_URL, key_source=source
    )
    try:
        return VastProvider(
            client,
            image=settings.vast_image,
            onstart=onstart,
            disk_gb=settings.deploy_disk_gb,
            extra_env=extra_env,
            runtype=runtype,
            image_login=settings.vast_image_login,
            default_filter=settings.vast_filter or DEFAULT_FILTER,
        )
    except ValueError as err:
        raise ProviderConfigError(f"vast provider settings: {err}") from None


def fit_onstart(script: str) -> str:
    """The onstart text to send: ``script`` itself when it fits vast.ai's 4048 characters,
    else ``script`` gzip-compressed and base64-encoded inside a short bash wrapper that
    unpacks it to a temporary file, runs it and removes it (vast.ai's API description:
    "gzip+base64 for longer scripts"). ValueError when even that does not fit."""
    if len(script) <= MAX_ONSTART_CHARS:
        return script
    packed = base64.b64encode(gzip.compress(script.encode("utf-8"), mtime=0)).decode("ascii")
    wrapped = (
        "#!/bin/bash\n"
        f"# vast-manager: the onstart script ({len(script)} characters), gzip+base64 to fit "
        f"vast.ai's {MAX_ONSTART_CHARS}\n"
        'f=$(mktemp -t vast-manager-onstart.XXXXXX) || exit 1\n'
        f"printf %s '{packed}' | base64 -d | gunzip > \"$f\" || exit 1\n"
        'bash "$f"; rc=$?; rm -f "$f"; exit $rc\n'
    )
    if len(wrapped) > MAX_ONSTART_CHARS:
        raise ValueError(
            f"the onstart script has {len(script)} characters and {len(wrapped)} even "
            f"compressed, above vast.ai's {MAX_ONSTART_CHARS}"
        )
    return wrapped


def parse_extra_env(text: str | None) -> dict[str, str]:
    """``VM_VAST_ENV``: a JSON object of environment variables (strings, numbers, booleans)."""
    if not text:
        return {}
    try:
        value = json.loads(text)
    except ValueError:
        raise ProviderConfigError("VM_VAST_ENV must be a JSON object") from None
    if not isinstance(value, dict):
        raise ProviderConfigError("VM_VAST_ENV must be a JSON object")
    out: dict[str, str] = {}
    for name, item in value.items():
        if not name or "=" in name or any(c.isspace() for c in name):
            raise ProviderConfigError(f"VM_VAST_ENV: {name!r} is not a variable name")
        if isinstance(item, bool):
            out[name] = "true" if item else "false"
        elif isinstance(item, (str, int, float)):
            out[name] = str(item)
        else:
            raise ProviderConfigError(f"VM_VAST_ENV: the value of {name} must be a string")
    return out


def public_instance(row: Mapping[str, Any]) -> ProviderInstance:
    """An instance row safe to store and show: credential-bearing fields dropped,
    ``reliability`` filled from ``reliability2`` (instances use the latter)."""
    out = {k: v for k, v in row.items() if k not in _SECRET_INSTANCE_FIELDS}
    if "reliability" not in out and "reliability2" in out:
        out["reliability"] = out["reliability2"]
    return out


def _normalize_offer(offer: Mapping[str, Any], storage_gb: float) -> dict[str, Any]:
    """vast.ai's JSON with the two fields the provider adds before it is parsed."""
    out = dict(offer)
    # The disk its dph_total was priced with (the search's allocated_storage), so the cost
    # model can take that storage out and price another disk (docs/operations.md).
    out.setdefault("allocated_storage", float(storage_gb))
    if "reliability" not in out and "reliability2" in out:
        out["reliability"] = out["reliability2"]
    return out


def _as_int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and value.strip().isdigit():
        return int(value)
    return None
