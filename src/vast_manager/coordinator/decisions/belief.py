"""What a GPU model can do, and what is beyond belief for it (docs/reliability.md, "No
rate on a host's word alone").

Pure: the figures are constants cited in docs/reliability.md; the caller passes the
references it read (the model's interval, the best confirmed rate of the same GPU
model). Three rules, strictest first:

* **Ceiling** (implausible, the result is refused as a lie): a GPU model's rate per GPU
  cannot pass twice what its memory bandwidth allows, anchored on the calibration
  card (an RTX 5070 Ti, 896 GB/s, GPU-bound at ~3 s a partition, 10 partitions a proof:
  120 proofs/h on one GPU; docs/discovery.md and docs/cuzk.md cite both figures).
* **Floor** (implausible): a proof cannot take less than half the GPU time of its
  partitions on both GPU workers of one card; the synthesis of a partition (~29 s on the
  calibration host) comes on top, so an honest proof is far above it.
* **Beyond belief** (``unconfirmed``, held until a directed re-benchmark agrees): a
  claim compared only with references the claimant cannot have set (``References``:
  the model's interval for its hardware as a new host's, other machines' confirmed
  rates, the machine's own first rate), so no lie under the line raises the line.
"""

from __future__ import annotations

from dataclasses import dataclass

from vast_manager.common.hardware_facts import GPU_SPECS, canonical_gpu_name

#: The calibration card: an RTX 5070 Ti's memory bandwidth, GB/s (its spec sheet).
REFERENCE_MEM_BW_GBPS = 896.0
#: GPU seconds per partition on the calibration card ("GPU takes ~3s/partition",
#: docs/discovery.md citing cuzk-bench).
REFERENCE_PARTITION_GPU_S = 3.0
#: Partitions of a PoRep 32 GiB C2 proof (docs/discovery.md, the pcie capacity).
PARTITIONS_PER_PROOF = 10
#: GPU workers per device (cuzk's ``gpu_workers_per_device``, docs/cuzk.md).
WORKERS_PER_GPU = 2
#: The calibration card's GPU-bound rate on one GPU: 3600 / (10 x 3 s) = 120 proofs/h.
REFERENCE_RATE_PER_GPU = 3600.0 / (PARTITIONS_PER_PROOF * REFERENCE_PARTITION_GPU_S)
#: How far above the bandwidth-scaled rate a ceiling sits (a card's own tuning, a
#: faster memory clock than its sheet): anything past it is not this card.
CEILING_FACTOR = 2.0
#: How far above the rate model's 90th percentile for its hardware (predicted as a new
#: host: never from the machine's own runs) a claim is held for confirmation: of 1,800
#: honest first benchmarks on the simulated market 13.4% passed 1x, 0.8% 1.25x, 0.1%
#: 1.5x (largest 1.72x; ``python bench/belief.py``), while a lie that doubles the
#: prediction is held. Those few honest ones are confirmed by their re-benchmark.
MODEL_FACTOR = 1.5
#: Where the model has no confident basis (its GPU model or CPU family never measured,
#: and no twin), the interval itself already carries the model's doubt: a claim above
#: the 90th percentile is held until a watched re-benchmark confirms it.
NOVEL_FACTOR = 1.0
#: How far above the median of other machines' confirmed rates per GPU on the same
#: hardware (a twin), or above the machine's own first counted rate, a claim is held.
#: Hosts of one GPU, CPU and RAM differ by what their offers do not show: in the
#: simulated market an honest benchmark reaches 6x its twins' median and 20% of them
#: pass 1.5x, so this line holds 12% of honest first benchmarks that have a twin there
#: (``python bench/belief.py``); each is counted once its watched re-benchmark agrees.
#: Requiring the model's interval too (``TWIN_MODEL_FACTOR`` above 0: 1.25 held 0.4%)
#: let a lie once counted widen the model's interval and admit the next: the probe's
#: chain counted every other claim. A re-benchmark for a few honest hosts is the price.
TWIN_FACTOR = 1.5
TWIN_MODEL_FACTOR = 0.0
#: A confirming re-benchmark agrees with a held claim within this share either way (the
#: rate counted is then the lower of the two): a "confirmation" far above the claim is
#: no confirmation of it.
AGREE_BAND = 0.2


#: The most a host's own ``gpu_mem_bw`` may claim for a model the table lacks: the
#: fastest card the table knows (a faster report is read as that).
MAX_KNOWN_MEM_BW_GBPS = max(spec.mem_bw_gbps for spec in GPU_SPECS.values())
#: The bandwidth a model the table lacks is bounded by when its offer reports none: the
#: most conservative (slowest) card the table knows, never the global ceiling.
MIN_KNOWN_MEM_BW_GBPS = min(spec.mem_bw_gbps for spec in GPU_SPECS.values())


def bandwidth(gpu_name: str | None, offer_mem_bw_gbps: float | None = None) -> float:
    """The memory bandwidth (GB/s) a GPU's ceiling and floor are computed from: its spec
    sheet's; for a model the table lacks, the offer's ``gpu_mem_bw`` (vast.ai measures
    it per host) up to the fastest known card; else the slowest known card."""
    spec = GPU_SPECS.get(canonical_gpu_name(gpu_name)) if gpu_name else None
    if spec is not None:
        return float(spec.mem_bw_gbps)
    if offer_mem_bw_gbps is not None and offer_mem_bw_gbps > 0:
        return min(float(offer_mem_bw_gbps), MAX_KNOWN_MEM_BW_GBPS)
    return MIN_KNOWN_MEM_BW_GBPS


def gpu_bound_rate_per_gpu(gpu_name: str | None, offer_mem_bw_gbps: float | None = None
                           ) -> float:
    """What one GPU of this model makes when nothing else binds: the calibration card's
    120/h scaled by memory bandwidth."""
    return REFERENCE_RATE_PER_GPU * bandwidth(gpu_name, offer_mem_bw_gbps) \
        / REFERENCE_MEM_BW_GBPS


def ceiling_per_gpu(gpu_name: str | None, global_ceiling: float | None,
                    offer_mem_bw_gbps: float | None = None) -> float:
    """The most proofs/hour one GPU of this model can make: twice its GPU-bound rate,
    never above the operator's ``VM_MAX_RATE_PER_GPU_PER_HOUR`` where it is set. A model
    neither the spec table nor the offer's ``gpu_mem_bw`` bounds gets the operator's
    setting where it is set (their word for hardware this project does not know), else
    the slowest known card's ceiling."""
    own = CEILING_FACTOR * gpu_bound_rate_per_gpu(gpu_name, offer_mem_bw_gbps)
    if global_ceiling is None:
        return own
    known = (gpu_name is not None and canonical_gpu_name(gpu_name) in GPU_SPECS) or (
        offer_mem_bw_gbps is not None and offer_mem_bw_gbps > 0)
    return min(global_ceiling, own) if known else global_ceiling


def min_proof_seconds(gpu_name: str | None, offer_mem_bw_gbps: float | None = None) -> float:
    """The shortest a proof can take on this GPU model (the floor above). A floor errs
    the other way from a ceiling: a model the table lacks is floored on its offer's
    ``gpu_mem_bw`` (at most the fastest known card's), else on the fastest known card."""
    spec = GPU_SPECS.get(canonical_gpu_name(gpu_name)) if gpu_name else None
    if spec is not None:
        bw = float(spec.mem_bw_gbps)
    elif offer_mem_bw_gbps is not None and offer_mem_bw_gbps > 0:
        bw = min(float(offer_mem_bw_gbps), MAX_KNOWN_MEM_BW_GBPS)
    else:
        bw = MAX_KNOWN_MEM_BW_GBPS
    gpu_s = PARTITIONS_PER_PROOF * REFERENCE_PARTITION_GPU_S * REFERENCE_MEM_BW_GBPS / bw
    return gpu_s / WORKERS_PER_GPU / 2.0


@dataclass(frozen=True, slots=True)
class Expected:
    """The rate model's view of an offer's hardware, predicted as a new host's (so the
    machine's own runs do not pin it): its 90th percentile, and what the model never
    measured of it (no confident basis)."""

    high: float
    novel: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class References:
    """What a claim is compared with, none of it set by the claimant.

    ``expected_high``: the rate model's 90th percentile for the hardware, predicted as
    a new host's (None: no model); ``novel``: what the model has never measured of it
    (its GPU model, its CPU family: no confident basis); ``twin_median_per_gpu``: the
    median rate per GPU of *other* machines' confirmed measurements on the same
    hardware (None: no twin); ``own_first_per_gpu``: the machine's own first counted
    rate per GPU on this many GPUs (None: none), which its later samples never raise."""

    expected_high: float | None = None
    novel: tuple[str, ...] = ()
    twin_median_per_gpu: float | None = None
    own_first_per_gpu: float | None = None


def line_of(gpus: int, refs: References) -> tuple[float, str] | None:
    """The rate above which a claim on ``gpus`` GPUs is beyond belief, and what sets it
    (None: nothing to compare with): the lowest of ``TWIN_FACTOR`` x a twin's median (and
    ``TWIN_MODEL_FACTOR`` x the model's 90th percentile), ``TWIN_FACTOR`` x the
    machine's own first rate, ``MODEL_FACTOR`` x the model's 90th percentile,
    or, with no confident basis (no twin, hardware never measured), the 90th percentile
    itself. A confirmed claim reaches the model at most at this line (its influence on
    other hardware bounded by what the model already believed)."""
    n = max(1, gpus)
    lines: list[tuple[float, str]] = []
    twin = refs.twin_median_per_gpu
    high = refs.expected_high
    if twin is not None and twin > 0:
        floor = TWIN_MODEL_FACTOR * high if high is not None and high > 0 else 0.0
        lines.append((max(TWIN_FACTOR * twin * n, floor),
                      f"{TWIN_FACTOR:g}x the median confirmed rate of other machines with "
                      f"the same hardware ({twin:.1f}/h per GPU)" + (
                          f" and {TWIN_MODEL_FACTOR:g}x the rate model's 90th percentile "
                          f"({high:.1f}/h)" if floor else "")))
    own = refs.own_first_per_gpu
    if own is not None and own > 0:
        lines.append((TWIN_FACTOR * own * n,
                      f"{TWIN_FACTOR:g}x this machine's first counted rate ({own:.1f}/h "
                      "per GPU)"))
    if high is not None and high > 0:
        if twin is None and refs.novel:
            lines.append((NOVEL_FACTOR * high,
                          f"the rate model's 90th percentile for this hardware ({high:.1f}/h), "
                          "nothing like it measured (" + "; ".join(refs.novel) + ")"))
        else:
            lines.append((MODEL_FACTOR * high,
                          f"{MODEL_FACTOR:g}x the rate model's 90th percentile for this "
                          f"hardware ({high:.1f}/h)"))
    return min(lines, key=lambda x: x[0]) if lines else None


def model_cap(gpus: int, refs: References) -> float | None:
    """The most the rate model reads of a claim confirmed beyond belief: the strictest
    reference (a twin's ``TWIN_FACTOR`` x median on its own, else ``line_of``), so a
    confirmation the host may have forged moves other hardware no further than what was
    believed of its own before it."""
    twin = refs.twin_median_per_gpu
    line = line_of(gpus, refs)
    lines = [x for x in (TWIN_FACTOR * twin * max(1, gpus) if twin else None,
                         line[0] if line else None) if x is not None]
    return min(lines) if lines else None


def beyond_belief(rate: float, gpus: int, refs: References) -> str | None:
    """Why ``rate`` on ``gpus`` GPUs is beyond belief (held for a watched re-benchmark),
    or None: above ``line_of``."""
    found = line_of(gpus, refs)
    if found is None or rate <= found[0]:
        return None
    return f"{rate:.1f} proofs/h is above {found[1]}: {found[0]:.1f}/h"


def agrees(confirmed: float, claimed: float, band: float = AGREE_BAND) -> bool:
    """A re-benchmark's rate agrees with a held claim: within ``band`` of it either way."""
    return claimed * (1.0 - band) <= confirmed <= claimed * (1.0 + band)


def counted_rate(confirmed: float, claimed: float) -> float:
    """The rate a confirmation counts: the lower of the claim and its confirmation."""
    return min(confirmed, claimed)
