"""A cluster's own counts (``POST /api/production``): read, checked whole, then taken.

Any cluster that is not Curio's HarmonyDB (or one the coordinator cannot reach) reports
per instance, by the coordinator's id or the Curio node name it gave (``vm-<id>``), the
proofs completed and failed over a window. The body is checked whole before anything is
taken: the first thing wrong is named in one sentence and nothing is kept. The same
decisions read it as the database's rows (``operations.cluster``), as source ``cluster``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

from vast_manager.coordinator.decisions.attribution import NODE_NAME_PREFIX
from vast_manager.coordinator.decisions.cluster_verdict import CLUSTER, Delivered
from vast_manager.coordinator.exceptions import InvalidInput
from vast_manager.coordinator.textsafe import has_unsafe

MAX_ENTRIES = 10_000
MIN_WINDOW_S = 60.0
MAX_WINDOW_S = 7 * 86400.0
MAX_COUNT = 10_000_000
MAX_ERROR_CHARS = 500
_FIELDS = frozenset({"window_s", "instances"})
_ENTRY_FIELDS = frozenset({"instance_id", "node_name", "completed", "failed", "last_error"})
_NODE = re.compile(re.escape(NODE_NAME_PREFIX) + r"([1-9][0-9]{0,17})")


def _count(entry: dict[str, Any], name: str, where: str) -> int:
    value = entry.get(name)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_COUNT:
        raise InvalidInput(f"{where}: '{name}' must be a whole number from 0 to {MAX_COUNT}.",
                           field=name)
    return value


def _instance_id(entry: dict[str, Any], where: str) -> int:
    has_id, has_name = "instance_id" in entry, "node_name" in entry
    if has_id == has_name:
        raise InvalidInput(f"{where} must name its instance by 'instance_id' or 'node_name' "
                           "(one of them).", field="instance_id")
    if has_id:
        value = entry["instance_id"]
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 2**53:
            raise InvalidInput(f"{where}: 'instance_id' must be a positive whole number.",
                               field="instance_id")
        return value
    name = entry["node_name"]
    found = _NODE.fullmatch(name) if isinstance(name, str) else None
    if found is None:
        raise InvalidInput(f"{where}: 'node_name' must be a node name the coordinator gave "
                           f"({NODE_NAME_PREFIX}<instance id>).", field="node_name")
    return int(found.group(1))


def _error(entry: dict[str, Any], where: str) -> str | None:
    value = entry.get("last_error")
    if value is None:
        return None
    if not isinstance(value, str) or len(value) > MAX_ERROR_CHARS or has_unsafe(value):
        raise InvalidInput(f"{where}: 'last_error' must be text of at most {MAX_ERROR_CHARS} "
                           "printable characters.", field="last_error")
    return value


def parse_report(body: dict[str, Any], known: Callable[[int], bool]) -> dict[int, Delivered]:
    """The report's observations by instance id; ``known(id)`` says whether an instance is
    ours. Raises ``InvalidInput`` naming the first thing wrong."""
    extra = sorted(set(body) - _FIELDS)
    if extra:
        raise InvalidInput(f"Field '{extra[0]}' is not accepted.", field=extra[0])
    window = body.get("window_s")
    if (isinstance(window, bool) or not isinstance(window, int | float)
            or not math.isfinite(window) or not MIN_WINDOW_S <= window <= MAX_WINDOW_S):
        raise InvalidInput(f"Field 'window_s' must be seconds from {MIN_WINDOW_S:g} to "
                           f"{MAX_WINDOW_S:g}.", field="window_s")
    entries = body.get("instances")
    if not isinstance(entries, list) or not 1 <= len(entries) <= MAX_ENTRIES:
        raise InvalidInput(f"Field 'instances' must be a list of 1 to {MAX_ENTRIES} objects.",
                           field="instances")
    out: dict[int, Delivered] = {}
    for n, entry in enumerate(entries):
        where = f"instances[{n}]"
        if not isinstance(entry, dict):
            raise InvalidInput(f"{where} must be an object.", field="instances")
        extra = sorted(set(entry) - _ENTRY_FIELDS)
        if extra:
            raise InvalidInput(f"{where}: field '{extra[0]}' is not accepted.", field=extra[0])
        ident = _instance_id(entry, where)
        if ident in out:
            raise InvalidInput(f"{where} names instance {ident} a second time.",
                               field="instances")
        if not known(ident):
            raise InvalidInput(f"{where} names instance {ident}, which is not one of ours.",
                               field="instances")
        out[ident] = Delivered(_count(entry, "completed", where), _count(entry, "failed", where),
                               float(window), CLUSTER, _error(entry, where))
    return out
