"""image/vast-template.json against vast.ai's template API, as vast.ai documents it.

The schema below is written from vast.ai's docs at c6246226: the ``POST
/api/v0/template/`` request body of ``api-reference/openapi.yaml`` (its
properties; ``name`` and ``image`` required; ``runtype`` one of ssh, jupyter,
args) and ``api-reference/creating-and-using-templates-with-api.mdx``, which
marks ``docker_login_repo``, ``docker_login_user`` and ``docker_login_pass``
**required** (``""`` when not needed). docs/vast.md cites both.
"""

from __future__ import annotations

import json
from typing import Any

from vast_manager.coordinator.providers.vast.filters import OFFER_FIELDS
from vast_manager.coordinator.providers.vast.provider import DEFAULT_ONSTART, MAX_ONSTART_CHARS
from vast_manager.coordinator.settings import SETTINGS

from support.paths import REPO_ROOT

ROOT = REPO_ROOT
TEMPLATE = ROOT / "image" / "vast-template.json"

#: The template fields of the OpenAPI description, with the JSON type each takes.
TEMPLATE_FIELDS: dict[str, type | tuple[type, ...]] = {
    "name": str, "image": str, "tag": str, "env": str, "onstart": str, "runtype": str,
    "ssh_direct": bool, "jup_direct": bool, "jupyter_dir": str, "use_jupyter_lab": bool,
    "docker_login_repo": str, "docker_login_user": str, "docker_login_pass": str,
    "extra_filters": dict, "recommended_disk_space": (int, float), "desc": str,
    "readme": str, "args_str": str, "use_ssh": bool, "href": str, "repo": str,
    "private": bool, "volume_info": (dict, type(None)), "hash_id": str,
}
REQUIRED = ("name", "image", "docker_login_repo", "docker_login_user", "docker_login_pass")
RUNTYPES = ("ssh", "jupyter", "args")
OPS = ("eq", "neq", "gt", "gte", "lt", "lte", "in", "notin")


def template() -> dict[str, Any]:
    value = json.loads(TEMPLATE.read_text())
    assert isinstance(value, dict)
    return value


def test_every_field_is_one_vast_ai_documents_with_its_type() -> None:
    t = template()
    unknown = sorted(set(t) - set(TEMPLATE_FIELDS))
    assert unknown == [], f"fields vast.ai's template API does not have: {unknown}"
    for name, value in t.items():
        assert isinstance(value, TEMPLATE_FIELDS[name]), name


def test_the_required_fields_are_there() -> None:
    t = template()
    for name in REQUIRED:
        assert name in t, name
    assert t["name"] and t["image"]
    # A public image: the login fields are required, and empty.
    assert (t["docker_login_repo"], t["docker_login_user"], t["docker_login_pass"]) == ("",) * 3


def test_run_type_onstart_and_disk_are_what_the_coordinator_sends() -> None:
    t = template()
    assert t["runtype"] in RUNTYPES and t["runtype"] == "ssh"
    assert t["ssh_direct"] is True and t["use_ssh"] is True
    assert t["onstart"] == DEFAULT_ONSTART
    assert len(t["onstart"]) <= MAX_ONSTART_CHARS
    disk = next(s.default for s in SETTINGS if s.name == "deploy_disk_gb")
    assert t["recommended_disk_space"] >= disk


def test_extra_filters_are_offer_conditions_vast_ai_can_apply() -> None:
    filters = template()["extra_filters"]
    assert filters
    for name, cond in filters.items():
        assert name in OFFER_FIELDS, name
        assert isinstance(cond, dict) and cond and set(cond) <= set(OPS), name
    # The instance's cores, not the host's: vast.ai filters cpu_cores_effective itself.
    assert "cpu_cores_effective" in filters and "cpu_cores" not in filters
    assert filters["cuda_max_good"] == {"gte": 13.0}

