"""Offer filter strings in the official vastai CLI's syntax, turned into the JSON query it sends.

The translation mirrors ``parse_query`` and ``search__offers`` of the official
CLI (github.com/vast-ai/vast-cli): ``vast.py`` at commit 01163020 (the
single-file CLI published as the ``vastai`` package) and the identical
``parse_query`` in ``vastai/api/query.py`` at commit 37c43da8. What the CLI
does, and so what this module does:

- tokens are matched by the CLI's own regular expression; text it cannot
  consume is an error ("Unconsumed text");
- operators ``< <= > >= = == !=`` and the words ``lt lte gt gte eq neq noteq
  not eq in notin not in nin`` map to ``lt lte gt gte eq neq in notin``;
- aliases: ``dph -> dph_total``, ``cuda_vers -> cuda_max_good``,
  ``display_active -> gpu_display_active``, ``dlperf_usd ->
  dlperf_per_dphtotal``, ``flops_usd -> flops_per_dphtotal``;
- ``cpu_ram``, ``gpu_ram``, ``gpu_total_ram`` are given in GB and sent in MB
  (x1000, as a float); ``duration`` is given in days and sent in seconds;
- ``driver_version`` written with dots (``535.86.05``) becomes 535086005;
- every other value is sent as the string it was written as (``num_gpus>=2``
  sends ``"2"``; vast.ai compares it numerically), with ``_`` turned into a
  space (``RTX_4090`` -> ``"RTX 4090"``) and surrounding double quotes dropped;
  ``true``/``True``, ``false``/``False``, ``null``/``None`` become JSON
  literals (not inside ``in`` lists, where the CLI keeps strings);
- ``field=any`` (or ``?``, ``*``) removes that field, defaults included;
- the default query ``verified=true external=false rentable=true
  rented=false`` comes first, then ``order`` (default ``score-``), ``type``
  (default ``on-demand``), ``limit`` when given, ``allocated_storage`` (GB,
  default 5.0).

Where we are stricter than the CLI, on purpose: a field the CLI does not know
is an error here (the CLI only prints a warning and sends it, so a typo would
silently widen the search that deploys spend money on), and every error is a
``FilterError`` naming the offending token. The refactored CLI command
(``vastai/cli/commands/offers.py`` at 2560b87d) dropped ``rented=false`` from
its defaults; we keep it, as ``vast.py`` and the SDK's ``search_offers`` do,
because an offer that is already rented is never one we can deploy on.
"""

from __future__ import annotations

import re
from typing import Any

#: The default offer filter: the original manager's (disk >= 250 GB, dph <= 0.9,
#: gpu_ram > 12.5 GB, inet_down > 100 Mb/s, CUDA >= 13.0) with its CPU and RAM
#: conditions moved from the host to the instance. ``cpu_ram`` and ``cpu_cores``
#: are the whole host's (docs/vast.md): the original ``cpu_ram>=240 cpu_cores>25``
#: let through a 1-GPU slice of an 8-GPU 512 GB host that gets 64 GB. vast.ai
#: filters ``cpu_cores_effective`` (the instance's cores) itself; the RAM share
#: has no field to filter on, so the query keeps only what it implies (a host of
#: at least 128 GB) and ``vast_manager.coordinator.decisions.share`` judges the share of every offer
#: against VM_MIN_INSTANCE_RAM_GB. ``inet_down_cost<=0.02`` caps the download price
#: ($/GB, not in ``dph_total``): a fresh instance downloads ~50 GB, so at most $1.00 of
#: setup bandwidth (docs/operations.md, "What an instance costs").
DEFAULT_FILTER = (
    "disk_space>=250 dph<=0.9 gpu_ram>12.5 cpu_ram>=128 cpu_cores_effective>25 inet_down>100 "
    "cuda_vers>=13.0 inet_down_cost<=0.02"
)

#: The CLI's default order (``-o score-``).
DEFAULT_ORDER = "score-"
#: The CLI's default ``--storage`` (GB priced into ``dph_total``).
DEFAULT_STORAGE_GB = 5.0

# The CLI's ``offers_fields`` (vast.py 01163020; query.py 37c43da8 adds cluster_id).
OFFER_FIELDS: frozenset[str] = frozenset(
    {
        "bw_nvlink",
        "cluster_id",
        "compute_cap",
        "cpu_arch",
        "cpu_cores",
        "cpu_cores_effective",
        "cpu_ghz",
        "cpu_ram",
        "cuda_max_good",
        "datacenter",
        "direct_port_count",
        "driver_version",
        "disk_bw",
        "disk_space",
        "dlperf",
        "dlperf_per_dphtotal",
        "dph_total",
        "duration",
        "external",
        "flops_per_dphtotal",
        "gpu_arch",
        "gpu_display_active",
        "gpu_frac",
        "gpu_mem_bw",
        "gpu_name",
        "gpu_ram",
        "gpu_total_ram",
        "gpu_max_power",
        "gpu_max_temp",
        "has_avx",
        "host_id",
        "id",
        "inet_down",
        "inet_down_cost",
        "inet_up",
        "inet_up_cost",
        "machine_id",
        "min_bid",
        "mobo_name",
        "num_gpus",
        "pci_gen",
        "pcie_bw",
        "reliability",
        "rentable",
        "rented",
        "storage_cost",
        "static_ip",
        "total_flops",
        "ubuntu_version",
        "verification",
        "verified",
        "vms_enabled",
        "geolocation",
    }
)

# The CLI's ``offers_alias``.
OFFER_ALIASES: dict[str, str] = {
    "cuda_vers": "cuda_max_good",
    "display_active": "gpu_display_active",
    "dlperf_usd": "dlperf_per_dphtotal",
    "dph": "dph_total",
    "flops_usd": "flops_per_dphtotal",
}

# The CLI's ``offers_mult``: the user writes GB (or days), vast.ai stores MB (or seconds).
OFFER_MULTIPLIERS: dict[str, float] = {
    "cpu_ram": 1000,
    "gpu_ram": 1000,
    "gpu_total_ram": 1000,
    "duration": 24.0 * 60.0 * 60.0,
}

# The CLI's default query (``search__offers`` without ``-n``).
_DEFAULT_QUERY: tuple[tuple[str, dict[str, Any]], ...] = (
    ("verified", {"eq": True}),
    ("external", {"eq": False}),
    ("rentable", {"eq": True}),
    ("rented", {"eq": False}),
)

_OP_NAMES: dict[str, str] = {
    ">=": "gte",
    ">": "gt",
    "gt": "gt",
    "gte": "gte",
    "<=": "lte",
    "<": "lt",
    "lt": "lt",
    "lte": "lte",
    "!=": "neq",
    "==": "eq",
    "=": "eq",
    "eq": "eq",
    "neq": "neq",
    "noteq": "neq",
    "not eq": "neq",
    "notin": "notin",
    "not in": "notin",
    "nin": "notin",
    "in": "in",
}

# Verbatim the CLI's pattern: field, operator, spaces, value (list, quoted or bare), spaces.
_TOKEN = re.compile(
    r"([a-zA-Z0-9_]+)( *[=><!]+| +(?:[lg]te?|nin|neq|eq|not ?eq|not ?in|in) )?( *)"
    r"(\[[^\]]+\]|\"[^\"]+\"|[^ ]+)?( *)"
)

_VALID_TYPES = ("on-demand", "bid", "reserved")


class FilterError(ValueError):
    """A filter string the official CLI would refuse (or we refuse); names the bad token."""


def _numeric_version(text: str) -> int | None:
    """``535.86.05`` -> 535086005, as the CLI's ``numeric_version``; None when not X.Y.Z."""
    parts = text.split(".")
    if len(parts) != 3 or not all(p.isdigit() for p in parts):
        return None
    return int("".join(p.zfill(3) for p in parts))


_ORDERING_OPS = frozenset({"gt", "gte", "lt", "lte"})


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _scalar(value: str) -> Any:
    if value in ("true", "True"):
        return True
    if value in ("false", "False"):
        return False
    if value in ("None", "null"):
        return None
    return value


def _find_unconsumed(text: str) -> str:
    """The first stretch of ``text`` the CLI's regex skips over, to name in the error."""
    pos = 0
    for m in _TOKEN.finditer(text):
        if m.start() != pos:
            break
        pos = m.end()
    if pos >= len(text):
        return text
    rest = text[pos:]
    return rest.split(" ", 1)[0] or rest


def parse_filter(text: str, base: dict[str, Any] | None = None) -> dict[str, Any]:
    """Translate a filter in the CLI's query syntax into vast.ai's JSON conditions.

    ``base`` holds conditions to start from (the CLI passes its default query);
    it is not modified. Returns only field conditions, no order/type/limit.
    """
    res: dict[str, dict[str, Any]] = {k: dict(v) for k, v in (base or {}).items()}
    text = text.strip()
    if not text:
        return res
    matches = list(_TOKEN.finditer(text))
    if "".join(m.group(0) for m in matches) != text:
        raise FilterError(
            f"cannot parse {_find_unconsumed(text)!r} in filter {text!r} "
            "(expected field, operator, value; e.g. gpu_ram>12.5)"
        )
    for m in matches:
        token = m.group(0).strip()
        field, op_raw, _, raw_value, _ = m.groups()
        raw_value = (raw_value or "").strip(",[]")
        field = OFFER_ALIASES.get(field, field)
        if field not in OFFER_FIELDS:
            raise FilterError(f"unknown field in {token!r}: {field!r} is not an offer field")
        op = _OP_NAMES.get((op_raw or "").strip())
        if op is None:
            raise FilterError(
                f"unknown or missing operator in {token!r} (use one of < <= > >= = == != in notin)"
            )
        value: Any = raw_value
        if field == "driver_version" and "." in raw_value:
            value = _numeric_version(raw_value)
            if value is None:
                raise FilterError(f"bad driver version in {token!r} (expected X.Y.Z)")
        if op in ("in", "notin"):
            value = [x.strip() for x in raw_value.split(",") if x.strip()]
        if value == [] or value == "":
            raise FilterError(f"missing value in {token!r}")
        if isinstance(value, str) and value in ("?", "*", "any"):
            if op != "eq":
                raise FilterError(f"wildcard only makes sense with '=' in {token!r}")
            # As the CLI: "field=any" drops the condition, a default one included.
            res.pop(field, None)
            continue
        if isinstance(value, str):
            value = value.replace("_", " ").strip('"')
        elif isinstance(value, list):
            value = [x.replace("_", " ").strip('"') for x in value]
        cond = res.setdefault(field, {})
        if field in OFFER_MULTIPLIERS:
            if not isinstance(value, str):
                raise FilterError(f"{field} takes one number, not a list, in {token!r}")
            try:
                cond[op] = float(value) * OFFER_MULTIPLIERS[field]
            except ValueError:
                raise FilterError(f"{field} needs a number in {token!r}") from None
        elif isinstance(value, str):
            if op in _ORDERING_OPS and not _is_number(value):
                # "num_gpus>=abc" would otherwise match nothing and read as "no offers".
                raise FilterError(f"{field} needs a number after {op_raw.strip()!r} in "
                                  f"{token!r}, e.g. {field}>=2")
            cond[op] = _scalar(value)
        else:
            cond[op] = value
    return res


def _parse_order(order: str) -> list[list[str]]:
    """The CLI's ``-o``: comma-separated fields, ``-`` suffix for descending, ``+`` ascending."""
    out: list[list[str]] = []
    for name in order.split(","):
        name = name.strip()
        if not name:
            continue
        direction = "asc"
        field = name
        if name.strip("-") != name:
            direction = "desc"
            field = name.strip("-")
        if name.strip("+") != name:
            direction = "asc"
            field = name.strip("+")
        out.append([OFFER_ALIASES.get(field, field), direction])
    return out


def build_search_query(
    filter_text: str | None,
    *,
    order: str = DEFAULT_ORDER,
    type: str = "on-demand",  # named as the CLI option and the JSON key
    limit: int | None = None,
    storage_gb: float = DEFAULT_STORAGE_GB,
    no_default: bool = False,
) -> dict[str, Any]:
    """The exact JSON body ``vastai search offers`` POSTs to ``/api/v0/bundles/``.

    ``filter_text`` None means no user conditions (only the defaults); callers
    wanting the original manager's filter pass ``DEFAULT_FILTER``.
    """
    base = {} if no_default else {k: dict(v) for k, v in _DEFAULT_QUERY}
    query: dict[str, Any] = parse_filter(filter_text or "", base)
    query["order"] = _parse_order(order)
    if type == "interruptible":  # the CLI's backwards-compatible spelling
        type = "bid"
    if type not in _VALID_TYPES:
        raise FilterError(f"unknown offer type {type!r} (one of {', '.join(_VALID_TYPES)})")
    query["type"] = type
    if limit:
        query["limit"] = int(limit)
    query["allocated_storage"] = float(storage_gb)
    return query


def apply_local_filters(
    offers: list[dict[str, Any]], query: dict[str, Any]
) -> list[dict[str, Any]]:
    """The filtering the CLI does itself on the search's answer (vast.py 01163020,
    ``search__offers``): the ``rented`` condition, a missing value read as False.
    The CLI's own comment says the database call does not do this yet.
    """
    cond = query.get("rented")
    if not isinstance(cond, dict) or not cond:
        return offers
    op, target = next(iter(cond.items()))
    kept = []
    for offer in offers:
        rented = offer.get("rented")
        rented = False if rented is None else rented
        if (
            (op == "eq" and rented == target)
            or (op == "neq" and rented != target)
            or (op == "in" and rented in target)
            or (op == "notin" and rented not in target)
        ):
            kept.append(offer)
    return kept
