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
  the model's interval for its hardware as a new host's, the machine's own first rate),
  set where honest benchmarks do not go.
* **Bounded learning**: a counted rate reaches the model, and other machines' twins, no
  higher than what was believed of its hardware before it (``learn_bound``) until the
  work it delivers agrees, so no lie under the line raises the next one's references.
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
#: host: never from the machine's own runs) a claim is held for confirmation, where the
#: model has a confident basis (it measured the GPU model and the CPU family): set where
#: honest first benchmarks do not go (``python bench/belief.py`` prints the figures; see
#: docs/reliability.md, "No rate on a host's word alone"). A lie under it is counted for
#: its host but reaches the model no higher than ``learn_bound`` until its delivery agrees.
MODEL_FACTOR = 1.75
#: The same where the model has no confident basis (its GPU model or CPU family never
#: measured): its interval is wider there, and honest benchmarks land lower in it.
NOVEL_FACTOR = 2.0
#: How far above its card's GPU-bound rate (``gpu_bound_rate_per_gpu``: the calibration
#: card's 120/h scaled by memory bandwidth, what the ceiling is twice of) a claim is held,
#: model or no model: honest benchmarks stay under 1.1x it (``python bench/belief.py``),
#: and it needs no fit, so it holds a claim before the first one too.
BANDWIDTH_FACTOR = 1.25
#: How far above the machine's own first counted rate per GPU (on as many GPUs) a later
#: claim of the same machine is held: its own later samples never raise its own line.
OWN_FACTOR = 1.5
#: The most the model (and other machines' twins) reads of a counted rate until the
#: work the host delivers agrees with it: its hardware's 90th percentile, and this many
#: times the median confirmed rate per GPU of other machines with the same GPU model and
#: count, CPU and RAM class (a twin). Honest twins differ by what their offers do not
#: show (neighbours, PCIe), so a twin is no hold line (``python bench/belief.py``: a
#: fifth of honest benchmarks pass 1.5x their twins' median); it only bounds what a
#: claim teaches before its delivery is known, so a chain of lies under the line moves
#: neither the model nor the next claim's references.
TWIN_FACTOR = 1.0
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


def known_gpu_bound_per_gpu(gpu_name: str | None, offer_mem_bw_gbps: float | None = None
                            ) -> float | None:
    """``gpu_bound_rate_per_gpu`` where the bandwidth is known (the spec table's, or the
    offer's ``gpu_mem_bw``); None for a model the table lacks with no bandwidth."""
    known = (gpu_name is not None and canonical_gpu_name(gpu_name) in GPU_SPECS) or (
        offer_mem_bw_gbps is not None and offer_mem_bw_gbps > 0)
    return gpu_bound_rate_per_gpu(gpu_name, offer_mem_bw_gbps) if known else None


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
    median rate per GPU of *other* machines' measurements on the same hardware that the
    model reads whole (None: no twin; it bounds learning, it holds nothing);
    ``own_first_per_gpu``: the machine's own first counted rate per GPU on this many
    GPUs (None: none), which its later samples never raise;
    ``gpu_bound_per_gpu``: its card's GPU-bound rate (None: a model the spec table lacks
    with no ``gpu_mem_bw`` in its offer)."""

    expected_high: float | None = None
    novel: tuple[str, ...] = ()
    twin_median_per_gpu: float | None = None
    own_first_per_gpu: float | None = None
    gpu_bound_per_gpu: float | None = None


def line_of(gpus: int, refs: References) -> tuple[float, str] | None:
    """The rate above which a claim on ``gpus`` GPUs is beyond belief, and what sets it
    (None: nothing to compare with): the lowest of ``BANDWIDTH_FACTOR`` x the card's
    GPU-bound rate, ``OWN_FACTOR`` x the machine's own first rate and ``MODEL_FACTOR`` x
    the model's 90th percentile (``NOVEL_FACTOR`` where the model never measured the
    hardware: no confident basis)."""
    n = max(1, gpus)
    lines: list[tuple[float, str]] = []
    bound = refs.gpu_bound_per_gpu
    if bound is not None and bound > 0:
        lines.append((BANDWIDTH_FACTOR * bound * n,
                      f"{BANDWIDTH_FACTOR:g}x what its GPU's memory bandwidth allows "
                      f"({bound:.1f}/h per GPU)"))
    own = refs.own_first_per_gpu
    if own is not None and own > 0:
        lines.append((OWN_FACTOR * own * n,
                      f"{OWN_FACTOR:g}x this machine's first counted rate ({own:.1f}/h "
                      "per GPU)"))
    high = refs.expected_high
    if high is not None and high > 0:
        if refs.novel:
            lines.append((NOVEL_FACTOR * high,
                          f"{NOVEL_FACTOR:g}x the rate model's 90th percentile for this "
                          f"hardware ({high:.1f}/h), nothing like it measured ("
                          + "; ".join(refs.novel) + ")"))
        else:
            lines.append((MODEL_FACTOR * high,
                          f"{MODEL_FACTOR:g}x the rate model's 90th percentile for this "
                          f"hardware ({high:.1f}/h)"))
    return min(lines, key=lambda x: x[0]) if lines else None


def learn_bound(gpus: int, refs: References) -> float | None:
    """The most the rate model (and other machines' twins) reads of a counted rate on
    ``gpus`` GPUs until the host's delivered work agrees with it: what was believed of
    its hardware before it, the lower of the model's 90th percentile and ``TWIN_FACTOR``
    x a twin's median (None: neither known). Never set by the claimant: the 90th
    percentile is predicted as a new host's, a twin is other machines' unbounded rates."""
    bounds = [b for b in (refs.expected_high,
                          TWIN_FACTOR * refs.twin_median_per_gpu * max(1, gpus)
                          if refs.twin_median_per_gpu else None)
              if b is not None and b > 0]
    return min(bounds) if bounds else None


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
