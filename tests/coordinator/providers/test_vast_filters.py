"""Filter strings -> the exact JSON body ``vastai search offers`` POSTs (vast-cli vast.py 01163020;
``parse_query`` of ``vastai/api/query.py`` unchanged in its effect at 55679830).

Each expected body below is written out as the official CLI builds it for
``vastai search offers '<filter>'`` with its defaults (``-o score-``,
``--type on-demand``, ``--storage 5.0``). Compared as canonical JSON text, so
``12500.0`` vs ``12500`` and ``"2"`` vs ``2`` count as differences, as they
do on the wire.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from vast_manager.coordinator.providers.vast.filters import (
    DEFAULT_FILTER,
    FilterError,
    apply_local_filters,
    build_search_query,
    parse_filter,
)


def canonical(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True)


TABLE: list[tuple[str, dict[str, Any]]] = [
    (
        # Our default: the original manager's, its CPU condition on the instance's cores.
        DEFAULT_FILTER,
        {
            "verified": {"eq": True},
            "external": {"eq": False},
            "rentable": {"eq": True},
            "rented": {"eq": False},
            "disk_space": {"gte": "250"},
            "dph_total": {"lte": "0.9"},
            "gpu_ram": {"gt": 12500.0},
            "cpu_ram": {"gte": 128000.0},
            "cpu_cores_effective": {"gt": "25"},
            "inet_down": {"gt": "100"},
            "cuda_max_good": {"gte": "13.0"},
            "inet_down_cost": {"lte": "0.02"},
            "order": [["score", "desc"]],
            "type": "on-demand",
            "allocated_storage": 5.0,
        },
    ),
    (
        # The original manager's filter (docs/operations.md), host figures.
        "disk_space>=250 dph<=0.9 gpu_ram>12.5 cpu_ram>=240 cpu_cores>25 inet_down>100 "
        "cuda_vers>=13.0",
        {
            "verified": {"eq": True},
            "external": {"eq": False},
            "rentable": {"eq": True},
            "rented": {"eq": False},
            "disk_space": {"gte": "250"},
            "dph_total": {"lte": "0.9"},
            "gpu_ram": {"gt": 12500.0},
            "cpu_ram": {"gte": 240000.0},
            "cpu_cores": {"gt": "25"},
            "inet_down": {"gt": "100"},
            "cuda_max_good": {"gte": "13.0"},
            "order": [["score", "desc"]],
            "type": "on-demand",
            "allocated_storage": 5.0,
        },
    ),
    (
        "gpu_ram>12.5 cpu_ram>=240 num_gpus>=2 dph<=0.9 cuda_vers>=13.0",
        {
            "verified": {"eq": True},
            "external": {"eq": False},
            "rentable": {"eq": True},
            "rented": {"eq": False},
            "gpu_ram": {"gt": 12500.0},
            "cpu_ram": {"gte": 240000.0},
            "num_gpus": {"gte": "2"},
            "dph_total": {"lte": "0.9"},
            "cuda_max_good": {"gte": "13.0"},
            "order": [["score", "desc"]],
            "type": "on-demand",
            "allocated_storage": 5.0,
        },
    ),
    (
        "gpu_name=RTX_4090 num_gpus=1",
        {
            "verified": {"eq": True},
            "external": {"eq": False},
            "rentable": {"eq": True},
            "rented": {"eq": False},
            "gpu_name": {"eq": "RTX 4090"},
            "num_gpus": {"eq": "1"},
            "order": [["score", "desc"]],
            "type": "on-demand",
            "allocated_storage": 5.0,
        },
    ),
    (
        # The CLI's own example, spaces around the operator, a boolean.
        "reliability > 0.98 num_gpus=1 gpu_name=RTX_3090 rented=False",
        {
            "verified": {"eq": True},
            "external": {"eq": False},
            "rentable": {"eq": True},
            "rented": {"eq": False},
            "reliability": {"gt": "0.98"},
            "num_gpus": {"eq": "1"},
            "gpu_name": {"eq": "RTX 3090"},
            "order": [["score", "desc"]],
            "type": "on-demand",
            "allocated_storage": 5.0,
        },
    ),
    (
        'gpu_name in ["RTX 4090", "RTX 3090"] geolocation notin [CN,VN]',
        {
            "verified": {"eq": True},
            "external": {"eq": False},
            "rentable": {"eq": True},
            "rented": {"eq": False},
            "gpu_name": {"in": ["RTX 4090", "RTX 3090"]},
            "geolocation": {"notin": ["CN", "VN"]},
            "order": [["score", "desc"]],
            "type": "on-demand",
            "allocated_storage": 5.0,
        },
    ),
    (
        "reliability>0.99 num_gpus=4 geolocation in [TW,SE] gpu_name in [RTX_5060_Ti,RTX_4080S]",
        {
            "verified": {"eq": True},
            "external": {"eq": False},
            "rentable": {"eq": True},
            "rented": {"eq": False},
            "reliability": {"gt": "0.99"},
            "num_gpus": {"eq": "4"},
            "geolocation": {"in": ["TW", "SE"]},
            "gpu_name": {"in": ["RTX 5060 Ti", "RTX 4080S"]},
            "order": [["score", "desc"]],
            "type": "on-demand",
            "allocated_storage": 5.0,
        },
    ),
    (
        # "any" removes a condition, the defaults' included.
        "verified=any rented=any num_gpus>=4",
        {
            "external": {"eq": False},
            "rentable": {"eq": True},
            "num_gpus": {"gte": "4"},
            "order": [["score", "desc"]],
            "type": "on-demand",
            "allocated_storage": 5.0,
        },
    ),
    (
        "verified=False external=true",
        {
            "verified": {"eq": False},
            "external": {"eq": True},
            "rentable": {"eq": True},
            "rented": {"eq": False},
            "order": [["score", "desc"]],
            "type": "on-demand",
            "allocated_storage": 5.0,
        },
    ),
    (
        "disk_space>146 duration>24 gpu_ram>10 cuda_vers>=12.1 direct_port_count>=2 "
        "driver_version >= 535.86.05",
        {
            "verified": {"eq": True},
            "external": {"eq": False},
            "rentable": {"eq": True},
            "rented": {"eq": False},
            "disk_space": {"gt": "146"},
            "duration": {"gt": 2073600.0},
            "gpu_ram": {"gt": 10000.0},
            "cuda_max_good": {"gte": "12.1"},
            "direct_port_count": {"gte": "2"},
            "driver_version": {"gte": 535086005},
            "order": [["score", "desc"]],
            "type": "on-demand",
            "allocated_storage": 5.0,
        },
    ),
    (
        "gpu_total_ram>=48 gpu_name!=RTX_3060 pcie_bw>12",
        {
            "verified": {"eq": True},
            "external": {"eq": False},
            "rentable": {"eq": True},
            "rented": {"eq": False},
            "gpu_total_ram": {"gte": 48000.0},
            "gpu_name": {"neq": "RTX 3060"},
            "pcie_bw": {"gt": "12"},
            "order": [["score", "desc"]],
            "type": "on-demand",
            "allocated_storage": 5.0,
        },
    ),
    (
        # Word operators.
        "inet_down gte 500 cpu_cores lt 64 machine_id neq 12345",
        {
            "verified": {"eq": True},
            "external": {"eq": False},
            "rentable": {"eq": True},
            "rented": {"eq": False},
            "inet_down": {"gte": "500"},
            "cpu_cores": {"lt": "64"},
            "machine_id": {"neq": "12345"},
            "order": [["score", "desc"]],
            "type": "on-demand",
            "allocated_storage": 5.0,
        },
    ),
    (
        # Two conditions on one field (through its alias) merge.
        "dph>0.1 dph<0.5 dph_total!=0.3",
        {
            "verified": {"eq": True},
            "external": {"eq": False},
            "rentable": {"eq": True},
            "rented": {"eq": False},
            "dph_total": {"gt": "0.1", "lt": "0.5", "neq": "0.3"},
            "order": [["score", "desc"]],
            "type": "on-demand",
            "allocated_storage": 5.0,
        },
    ),
    (
        "cpu_arch=arm64 static_ip=true display_active==false dlperf_usd>=10",
        {
            "verified": {"eq": True},
            "external": {"eq": False},
            "rentable": {"eq": True},
            "rented": {"eq": False},
            "cpu_arch": {"eq": "arm64"},
            "static_ip": {"eq": True},
            "gpu_display_active": {"eq": False},
            "dlperf_per_dphtotal": {"gte": "10"},
            "order": [["score", "desc"]],
            "type": "on-demand",
            "allocated_storage": 5.0,
        },
    ),
    (
        "",
        {
            "verified": {"eq": True},
            "external": {"eq": False},
            "rentable": {"eq": True},
            "rented": {"eq": False},
            "order": [["score", "desc"]],
            "type": "on-demand",
            "allocated_storage": 5.0,
        },
    ),
]


@pytest.mark.parametrize(("text", "expected"), TABLE, ids=[t or "<empty>" for t, _ in TABLE])
def test_filter_table(text: str, expected: dict[str, Any]) -> None:
    assert canonical(build_search_query(text)) == canonical(expected)


def test_table_is_big_enough() -> None:
    assert len(TABLE) >= 12


def test_none_filter_is_defaults_only() -> None:
    assert canonical(build_search_query(None)) == canonical(TABLE[-1][1])


def test_key_order_matches_the_cli() -> None:
    # Defaults first, then conditions as written, then order/type/limit/storage.
    q = build_search_query("num_gpus=2 gpu_name=RTX_4090", limit=50)
    assert list(q) == [
        "verified",
        "external",
        "rentable",
        "rented",
        "num_gpus",
        "gpu_name",
        "order",
        "type",
        "limit",
        "allocated_storage",
    ]


def test_options_order_type_limit_storage_no_default() -> None:
    q = build_search_query(
        "id=4242 rentable=true",
        order="dph+,num_gpus-",
        type="interruptible",
        limit=10,
        storage_gb=250,
        no_default=True,
    )
    assert canonical(q) == canonical(
        {
            "id": {"eq": "4242"},
            "rentable": {"eq": True},
            "order": [["dph_total", "asc"], ["num_gpus", "desc"]],
            "type": "bid",
            "limit": 10,
            "allocated_storage": 250.0,
        }
    )


def test_parse_filter_does_not_modify_base() -> None:
    base = {"verified": {"eq": True}}
    out = parse_filter("verified=false", base)
    assert out == {"verified": {"eq": False}}
    assert base == {"verified": {"eq": True}}


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("gpu_ram>>12", "gpu_ram>>12"),
        ("gpu_rma>12", "gpu_rma"),
        ("num_gpus=2 verified", "verified"),
        ("$$ num_gpus=2", "$$"),
        ("num_gpus=2 -x", "-x"),
        ("cpu_ram>=lots", "cpu_ram>=lots"),
        ("dph<=any", "dph<=any"),
        ("geolocation in []", "geolocation in []"),
        ("cpu_ram in [1,2]", "cpu_ram in [1,2]"),
        ("driver_version>=535.86", "driver_version>=535.86"),
        ("gpu_name=", "gpu_name="),
    ],
)
def test_bad_filters_name_the_token(text: str, named: str) -> None:
    with pytest.raises(FilterError) as err:
        build_search_query(text)
    assert repr(named) in str(err.value)


def test_bad_type_is_filter_error() -> None:
    with pytest.raises(FilterError, match="'spot'"):
        build_search_query(None, type="spot")


def test_local_rented_filter_as_the_cli() -> None:
    offers = [{"id": 1, "rented": False}, {"id": 2, "rented": True}, {"id": 3}]
    q = build_search_query(None)
    assert [o["id"] for o in apply_local_filters(offers, q)] == [1, 3]
    q = build_search_query("rented=true")
    assert [o["id"] for o in apply_local_filters(offers, q)] == [2]
    q = build_search_query("rented=any")
    assert [o["id"] for o in apply_local_filters(offers, q)] == [1, 2, 3]
