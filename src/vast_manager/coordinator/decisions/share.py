"""What an instance gets of its host: its share of the RAM and cores an offer lists.

A vast.ai offer's ``cpu_ram`` and ``cpu_cores`` are the whole host's. An
instance gets RAM and CPU in proportion to its GPUs (vast.ai's docs,
guides/instances/docker-environment.mdx); ``cpu_cores_effective`` is the
cores the instance gets, so its RAM is about ``cpu_ram * cpu_cores_effective
/ cpu_cores`` (gpuhunt computes it so). Without cores, ``gpu_frac`` (the
offer's GPUs over the host's) gives the same fraction. docs/vast.md has the
sources.

RAM is in vast.ai's own GB (``cpu_ram`` is MB; the CLI divides by 1000 to
show and filter GB), so a share compares with the figures the CLI prints.
Pure: an ``Offer`` (coordinator.offers) in, ``Share`` out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from vast_manager.coordinator.offers import Offer

#: Upper edges of the RAM classes predictions keep apart, GB of the instance's share:
#: cuzk's table of seconds per proof by RAM (128 GiB 152 s, 256 GiB 53 s, 384 GiB 43 s,
#: 512 GiB 38 s) set in vast.ai's GB with room for how hosts list their RAM (the
#: original manager asked 240 GB for a 256 GiB host).
RAM_CLASS_EDGES_GB = (240.0, 360.0)


@dataclass(frozen=True, slots=True)
class Share:
    """The instance's share of an offer's host; None where the offer does not say."""

    ram_gb: float | None
    cpu_cores: float | None
    fraction: float | None
    #: How the figures were reached, for a person: "515 GB x 12/96 cores = 64.4 GB".
    formula: str


def _positive(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) and value > 0 else None


def _num(x: float) -> str:
    return f"{x:.0f}" if float(x).is_integer() else f"{x:.1f}"


def instance_share(offer: Offer) -> Share:
    """The RAM (GB) and cores the instance of ``offer`` would get, with the formula.

    Missing, zero or nonsensical fields give None with the reason in ``formula``,
    never a guess: an unknown share is not a sufficient one.
    """
    host_mb = _positive(offer.cpu_ram)
    cores = _positive(offer.cpu_cores)
    effective = _positive(offer.cpu_cores_effective)
    gpu_frac = _positive(offer.gpu_frac)
    if cores is not None and effective is not None:
        # More effective cores than the host has would be a listing error: the
        # instance cannot get more than the whole host.
        fraction = min(1.0, effective / cores)
        part = f"{_num(effective)}/{_num(cores)} cores"
        cpu: float | None = min(effective, cores)
    elif gpu_frac is not None:
        fraction = min(1.0, gpu_frac)
        part = f"gpu_frac {fraction:.3g}"
        cpu = effective if effective is not None else (
            cores * fraction if cores is not None else None)
    else:
        missing = "cpu_cores" if cores is None else "cpu_cores_effective"
        return Share(None, effective, None,
                     f"unknown (the offer lists no {missing} nor gpu_frac)")
    if host_mb is None:
        return Share(None, cpu, fraction, "unknown (the offer lists no cpu_ram)")
    host_gb = host_mb / 1000.0
    ram_gb = host_gb * fraction
    return Share(round(ram_gb, 1), cpu, fraction,
                 f"{_num(round(host_gb, 1))} GB x {part} = {ram_gb:.1f} GB")


def shortfall(share: Share, min_ram_gb: float) -> str | None:
    """Why the share is not enough for cuzk (a clause for a sentence), or None when it is."""
    if min_ram_gb <= 0:
        return None
    if share.ram_gb is None:
        return (f"the RAM its instance would get is {share.formula}, so cuzk's "
                f"{_num(min_ram_gb)} GB cannot be promised")
    if share.ram_gb < min_ram_gb:
        return (f"its instance would get about {share.ram_gb:.0f} GB of RAM "
                f"({share.formula}), below the {_num(min_ram_gb)} GB cuzk needs")
    return None


def ram_class(ram_gb: float | None) -> int | None:
    """The RAM class of a share (0, 1, 2: below, between and above RAM_CLASS_EDGES_GB)."""
    if ram_gb is None:
        return None
    return sum(1 for edge in RAM_CLASS_EDGES_GB if ram_gb >= edge)
