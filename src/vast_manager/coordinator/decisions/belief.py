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
* **Beyond belief** (``unconfirmed``, held until a directed re-benchmark agrees): more
  than ``BELIEF_FACTOR`` times the model's 90th percentile for the hardware, or more
  than ``BELIEF_FACTOR`` times the best confirmed rate per GPU of the same GPU model.
"""

from __future__ import annotations

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
#: How far above the hardware's expected rate a claim is held for confirmation.
BELIEF_FACTOR = 2.0
#: The floor for a GPU the table does not know: the fastest card's (H100 SXM) floor.
UNKNOWN_GPU_FLOOR_S = 2.0


def _bandwidth(gpu_name: str | None) -> float | None:
    if not gpu_name:
        return None
    spec = GPU_SPECS.get(canonical_gpu_name(gpu_name))
    return float(spec.mem_bw_gbps) if spec is not None else None


def ceiling_per_gpu(gpu_name: str | None, global_ceiling: float) -> float:
    """The most proofs/hour one GPU of this model can make (never above the global
    ``VM_MAX_RATE_PER_GPU_PER_HOUR``, which alone bounds a model the table lacks)."""
    bw = _bandwidth(gpu_name)
    if bw is None:
        return global_ceiling
    return min(global_ceiling,
               CEILING_FACTOR * REFERENCE_RATE_PER_GPU * bw / REFERENCE_MEM_BW_GBPS)


def min_proof_seconds(gpu_name: str | None) -> float:
    """The shortest a proof can take on this GPU model (the floor above)."""
    bw = _bandwidth(gpu_name)
    if bw is None:
        return UNKNOWN_GPU_FLOOR_S
    gpu_s = PARTITIONS_PER_PROOF * REFERENCE_PARTITION_GPU_S * REFERENCE_MEM_BW_GBPS / bw
    return gpu_s / WORKERS_PER_GPU / 2.0


def beyond_belief(
    rate: float, gpus: int, *, expected_high: float | None, best_per_gpu: float | None,
) -> str | None:
    """Why ``rate`` on ``gpus`` GPUs is beyond belief, or None.

    ``expected_high``: the model's 90th percentile for this hardware (None: no model);
    ``best_per_gpu``: the best confirmed rate per GPU of the same GPU model elsewhere
    (None: no such measurement)."""
    if expected_high is not None and expected_high > 0 and rate > BELIEF_FACTOR * expected_high:
        return (f"{rate:.1f} proofs/h is more than {BELIEF_FACTOR:g}x the rate model's 90th "
                f"percentile for this hardware ({expected_high:.1f}/h)")
    if best_per_gpu is not None and best_per_gpu > 0 \
            and rate / max(1, gpus) > BELIEF_FACTOR * best_per_gpu:
        return (f"{rate / max(1, gpus):.1f} proofs/h per GPU is more than {BELIEF_FACTOR:g}x "
                f"the best confirmed rate of the same GPU model ({best_per_gpu:.1f}/h per GPU)")
    return None


def agrees(confirmed: float, claimed: float, tolerance: float = 0.2) -> bool:
    """A re-benchmark's rate agrees with a held claim: at least (1 - tolerance) of it."""
    return confirmed >= claimed * (1.0 - tolerance)
