"""Offer features: the instance's share of the host, assumptions named, bad fields named."""

from __future__ import annotations

import pytest

from vast_manager.common.hardware_facts import cpu_family
from vast_manager.coordinator.discovery.features import (
    GIB,
    FeatureError,
    offer_features,
    offer_from_host_info,
)
from vast_manager.coordinator.discovery.measurements import MeasurementError, parse_measurement
from vast_manager.coordinator.offers import Offer, parse_offer
from vast_manager.coordinator.providers.local.catalog import local_offers


def _offer(**changes: object) -> Offer:
    offer = dict(local_offers()[0])
    offer.update(changes)
    return parse_offer(offer)


def test_a_slice_gets_its_share_of_the_hosts_vcpus_and_ram() -> None:
    # One GPU of an 8-GPU host with 128 vCPUs and 512 GB: 16 vCPUs and 64 GB.
    f = offer_features(_offer(num_gpus=1, cpu_cores=128, cpu_cores_effective=16,
                              cpu_ram=512_000))
    assert f.cpu_cores_effective == 16
    assert f.host_share == pytest.approx(0.125)
    assert f.ram_share_gib == pytest.approx(64e9 / GIB)
    whole = offer_features(_offer(num_gpus=8, cpu_cores=128, cpu_cores_effective=128,
                                  cpu_ram=512_000))
    assert whole.ram_share_gib == pytest.approx(512e9 / GIB)
    assert whole.host_share == 1.0


def test_pcie_is_capped_by_the_link_and_a_missing_figure_is_named() -> None:
    # The measured figure cannot exceed what Gen3 x4 carries.
    f = offer_features(_offer(pci_gen=3, gpu_lanes=4, pcie_bw=24.0))
    assert f.pcie_gbps == pytest.approx(0.985 * 4)
    missing = offer_features(_offer(pcie_bw=None, cpu_ghz=None))
    assert any("pcie_bw" in a for a in missing.assumed)
    assert any("cpu_ghz" in a for a in missing.assumed)
    assert offer_features(_offer(cpu_ghz=3.1)).assumed == ()


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"num_gpus": 0}, "num_gpus"),
        ({"num_gpus": 1.5}, "num_gpus"),
        ({"gpu_name": ""}, "gpu_name"),
        ({"cpu_ram": "lots"}, "cpu_ram"),
        ({"pcie_bw": -3}, "pcie_bw"),
        ({"cpu_cores": None, "cpu_cores_effective": None}, "cpu_cores_effective"),
        ({"cpu_ghz": True}, "cpu_ghz"),
    ],
)
def test_a_bad_field_is_named(change: dict[str, object], field: str) -> None:
    # A malformed field is refused as the offer is parsed, one out of the model's range by
    # the features: the same error, naming the field.
    with pytest.raises(FeatureError) as err:
        offer_features(_offer(**{"cpu_ghz": 3.0, **change}))
    assert err.value.field == field
    assert field in err.value.message


def test_cpu_families_group_models_of_one_generation() -> None:
    assert cpu_family("AMD EPYC 7502 32-Core Processor") == cpu_family(
        "AMD EPYC 7K62 48-Core Processor")
    assert cpu_family("AMD EPYC 7502 32-Core Processor") != cpu_family(
        "AMD EPYC 7543 32-Core Processor")
    assert cpu_family("Intel(R) Xeon(R) Gold 6248 CPU @ 2.50GHz") == "Intel Xeon Scalable gen 2"
    assert cpu_family("13th Gen Intel(R) Core(TM) i9-13900K") == "Intel Core gen 13"
    assert cpu_family("AMD Ryzen Threadripper PRO 5975WX 32-Cores") == "AMD Threadripper 5000"


def test_a_bring_your_own_agents_host_info_reads_as_an_offer() -> None:
    gpu = {"index": 0, "uuid": "GPU-1", "name": "NVIDIA GeForce RTX 4090",
           "memory_total_bytes": 24_000_000_000, "pcie_gen_max": 4, "pcie_width_max": 16,
           "pcie_gen_current": 4, "pcie_width_current": 16}
    host = {"cpu_model": "AMD EPYC 7502 32-Core Processor", "cpu_cores_logical": 64,
            "ram_total_bytes": 256_000_000_000, "gpus": [gpu, {**gpu, "index": 1}]}
    f = offer_features(offer_from_host_info(host, machine_id="rig-7"))
    assert (f.gpu_name, f.num_gpus, f.machine_id) == ("RTX 4090", 2, "rig-7")
    assert f.ram_share_gib == pytest.approx(256e9 / GIB)
    with pytest.raises(FeatureError) as err:
        offer_from_host_info({**host, "gpus": []}, machine_id="rig-7")
    assert err.value.field == "host.gpus"


def test_a_measurement_line_names_its_bad_field() -> None:
    good = {"machine_id": 41001, "offer": _offer().raw, "rate_per_hour": 61.4,
            "measured_at": 1_700_000_000.0}
    m = parse_measurement(good)
    assert (m.machine_id, m.source) == ("41001", "imported")
    assert parse_measurement(m.to_dict()) == m
    for bad, field in (
        ({**good, "offer": {**_offer().raw, "num_gpus": 0}}, "offer.num_gpus"),
        ({**good, "rate_per_hour": 0}, "rate_per_hour"),
        ({**good, "rate_per_hour": "61"}, "rate_per_hour"),
        ({**good, "measured_at": None}, "measured_at"),
        ({**good, "source": "rumour"}, "source"),
        ({**good, "machine_id": None}, "machine_id"),
        ({**good, "offer": []}, "offer"),
    ):
        with pytest.raises(MeasurementError) as err:
            parse_measurement(bad)
        assert err.value.field == field, bad
