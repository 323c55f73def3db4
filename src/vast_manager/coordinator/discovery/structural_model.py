"""The rate model: proofs/hour of any offer from its hardware and everything measured.

A Bayesian hierarchical model on the log of the rate (docs/discovery.md has the
derivation and the figures):

    log rate = softmin( softmin(log gpu, log pcie), log cpu, log memory )
               + a RAM-share term + small linear terms + host effect + noise

with four capacities in proofs/hour, each from a physical fact and a learned scale:

* **gpu**: GPUs x the card's class rate (anchored on an RTX 5070 Ti's GPU-bound
  rate, scaled by memory bandwidth) x a learned offset per GPU model;
* **cpu**: the instance's vCPUs^v x a per-vCPU synthesis rate (anchored on the
  CPU-bound 4x RTX 5060 Ti on a 16-thread Ryzen) x clock^g x a learned offset per
  CPU family;
* **pcie**: GPUs x host->GPU GB/s x proofs per GB streamed (each partition
  streams the SRS, which does not fit on the card);
* **memory**: partitions in flight ((RAM share - resident SRS, PCE and OS) / a
  partition's RAM, whole partitions, at least one, at most 18) over how long each
  holds its RAM (synthesis, faster on faster cores, plus its upload): Little's law,
  calibrated on cuzk's RAM table (128 GiB = 152 s/proof). What RAM a host leaves cuzk
  is not in its offer, so the count is a latent whole number around that staircase:
  near a step a new host's rate has two modes (one count or the next), and its
  prediction is the mixture; each measured slice's count is inferred by EM.

The soft-mins' sharpnesses are learned (the GPUs and their link meet in one of their
own), as are how synthesis grows with vCPUs, how a narrow link is shared by a host's
GPUs, and a smooth RAM-share term outside the soft-min (docs/discovery.md, section 2).
The binding resource is the one whose doubling raises the predicted rate most.

A per-machine effect (Student-t in log rate, scale ``sigma_host``, fitted by EM as a
scale mixture of normals) is marginalised out of the fit and then estimated for every
measured machine, so its repeated measurements pin its own prediction; measurements
carry noise ``sigma_noise``. Both spreads are estimated by the
Laplace-approximated marginal likelihood (which charges for the parameters the
fit spends), under priors that keep them sane with five measurements. The
parameter posterior is Gaussian (Laplace), so a prediction's 80% interval
includes what the model does not know yet: wide with little data, narrow with
much; a new host's interval is then calibrated on the measured machines, per binding
capacity. The point is the rate with the least expected absolute percentage error.
Each prediction is explained by exact Shapley shares of its log rate against a
reference host, which add up to the prediction.

Pure: numpy arrays in, dataclasses out; no I/O and no clock (``now`` is passed in).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

import numpy as np
from numpy.typing import NDArray
from scipy import optimize, special
from scipy.optimize import elementwise
from scipy.stats import t as student_t
from threadpoolctl import threadpool_limits

from vast_manager.coordinator.discovery.features import FeatureError, OfferFeatures, offer_features
from vast_manager.coordinator.discovery.measurements import RESOURCES, Measurement
from vast_manager.coordinator.offers import Offer

Array = NDArray[np.float64]

#: z of the 90th percentile: an 80% two-sided interval is mean +- Z80 sd.
Z80 = 1.2815515655446004


@dataclass(frozen=True, slots=True)
class Priors:
    """The facts that centre the model before it has measured anything, with log-sd's.

    Each anchor is a published or observed figure (docs/discovery.md cites them);
    the spreads say how far the model may move from it, in log rate.
    """

    # GPU: an RTX 5070 Ti rig reaches 90-110 proofs/h at its best with 512 GiB RAM,
    # where it is GPU-bound; other cards scale with memory bandwidth (MSM and NTT).
    gpu_rate_per_hour: float = 110.0
    gpu_ref_mem_bw_gbps: float = 896.0
    gpu_scale_sd: float = 0.35
    gpu_model_sd: float = 0.30
    # CPU: the operator's 4x RTX 5060 Ti made 38.8/h CPU-bound, on a 16-thread Ryzen 7
    # 5800X at 3.8 GHz as the local catalog has it: 2.43 proofs/h per vCPU. Upstream's
    # 96-core Zen 4 rig synthesising two proofs at once implies about a third of that
    # per thread (memory-bandwidth-bound), hence the wide spread.
    cpu_rate_per_vcpu_hour: float = 38.8 / 16
    cpu_ref_ghz: float = 3.8
    cpu_scale_sd: float = 0.5
    cpu_family_sd: float = 0.25
    ghz_exponent: float = 0.7
    ghz_exponent_sd: float = 0.4
    # How synthesis grows with the instance's vCPUs, about the anchor's 16: in proportion
    # a priori, but threads share the host's memory bandwidth (upstream's 96-core rig
    # makes about a third of the anchor's rate per thread, above), so the exponent is
    # learned.
    cpu_ref_vcpus: float = 16.0
    vcpu_exponent: float = 1.0
    vcpu_exponent_sd: float = 0.25
    # PCIe: a 32G PoRep proof is 10 partitions, each streaming ~48 GB of SRS bases
    # (45 GiB of parameters do not fit a 16-32 GB card).
    pcie_rate_per_gbps_hour: float = 3600.0 / (10 * 48.0)  # = 3600 / (10 x upload GB)
    # The 48 GB is this project's derivation; the one volume upstream documents is the
    # NTT's 12 GiB a partition, uploaded pinned and overlapped with compute
    # (docs/cuzk.md, "What crosses the PCIe link"). So a partition moves somewhere
    # between about 13 and 61 GB: a factor e each way (1.0 in log) puts 13 GB a little
    # over one sd below the centre, where 0.5 put it 2.6 sd out and a market whose links
    # carry that little held the few link-bound hosts it measured far below their rates
    # (docs/discovery.md, "Where the model is weak").
    pcie_scale_sd: float = 1.0
    # Memory (Little's law): partitions in flight / how long each holds its RAM. cuzk's
    # budget is MemTotal less a 5 GiB safety margin, of which the SRS keeps 45 GiB and
    # the PCE 25 (docs/cuzk.md, the memory budget); its memory "scales linearly as ~69 +
    # pw x 20 GiB" (pw = partitions in flight); whole partitions are admitted, one
    # always. Each holds its RAM while it is synthesised (~29 s on an idle host, faster
    # on faster cores) and uploaded (48 GB over PCIe). Calibrated so 128 GiB gives
    # cuzk's table figure, 152 s/proof (23.7/h), on a PCIe 4 x16 reference rig.
    ram_resident_gib: float = 75.0
    ram_partition_gib: float = 20.0
    synth_seconds_per_partition: float = 29.0
    upload_gb_per_partition: float = 48.0
    ram_table_gib: float = 128.0
    ram_table_rate_per_hour: float = 3600.0 / 152.0
    ram_table_pcie_gbps: float = 25.0
    ram_scale_sd: float = 0.35
    ram_resident_sd: float = 1.0  # in units of 10 GiB
    ram_partition_sd: float = 0.2
    # cuzk's [pipeline] max_parallel_synthesis default (config.rs; docs/cuzk.md): no more
    # partitions are synthesised at once, however much RAM there is.
    max_partitions_in_flight: int = 18
    # How the RAM share acts: "capacity" (partitions in flight over their hold time, a
    # limit in the soft-min, and the RAM-share term), "factor" (the RAM-share term alone:
    # a multiplicative effect on the whole rate, no limit of its own), or "choose": fit
    # both once ``ram_form_min_machines`` machines are measured and keep the one the
    # marginal likelihood prefers (with fewer, "capacity"). From the cold start's first
    # trials, not 30: until the choice is made, cuzk's staircase holds every unmeasured
    # host on a share between its steps to whole partitions in flight, and a market whose
    # RAM acts otherwise never gets those hosts tried (docs/discovery-passes.md,
    # "The RAM form chosen from eight machines").
    ram_form: str = "choose"
    ram_form_min_machines: int = 8
    # How sharp a step of the count is, in 1/partitions (a logistic in the RAM a host
    # leaves cuzk, which no offer shows): 4 = a quarter of a partition (5 GiB) wide.
    # Learned from which count measured hosts fall on.
    partition_step_sharpness: float = 4.0
    partition_step_sharpness_sd: float = 0.5
    sharpness: float = 8.0
    sharpness_sd: float = 0.5
    # The GPUs and the link that feeds them meet first, in a soft-min of their own: how
    # a transfer stalls a GPU (overlapped, in sequence, or between) is a property of
    # that pair, not of how the fed GPUs then meet the CPU and the RAM.
    feed_sharpness: float = 8.0
    feed_sharpness_sd: float = 0.7
    linear_sd: float = 0.10
    # The power of the GPU count outside the soft-mins. GPUs on one host share what no
    # capacity shows (its memory bandwidth, its PCIe root, the threads that feed them):
    # the operator's 4x RTX 5060 Ti scaled badly, and every market written unlike the
    # simulator scales several GPUs below linear (n^-0.1 to n^-0.19 beside linear). At 0
    # a priori (GPUs add up) a cold start over-predicted the several-GPU hosts its fleets
    # counted on by about a fifth; wider spreads about 0 held no more bars
    # (docs/discovery-passes.md, "The pass on the GPU count's prior" and "The GPU count's
    # prior centred below linear").
    multi_gpu: float = -0.10
    multi_gpu_sd: float = 0.10
    # The RAM-share term's coefficients (``RAM_HINGES_GIB``), 0 a priori.
    ram_hinge_sd: float = 0.25
    # Where the RAM share is a factor on the whole rate (``ram_form``), the term reads
    # the share over (GPUs)^e: a host may need RAM for each GPU it feeds (e = 1) or for
    # the work as a whole (e = 0, a priori).
    ram_per_gpu_sd: float = 0.5
    # A link of x8 or fewer lanes a GPU on a host of several GPUs is often a switch or
    # riser the host's GPUs share, which the offer's per-GPU pcie_bw does not show: each
    # GPU's bandwidth is divided by (the host's GPUs)^s, s learned, 0 a priori.
    shared_link_max_lanes: int = 8
    shared_link: float = 0.0
    shared_link_sd: float = 0.3
    other_sd: float = 0.05
    deviation_coef: float = 0.5
    deviation_coef_sd: float = 0.5
    # Spreads (log rate): a host's hidden effect, and one benchmark's noise.
    host_sd: float = 0.15
    noise_sd: float = 0.06
    spread_log_sd: float = 0.5
    prior_dof: float = 4.0
    host_tail_dof: float = 4.0  # host effects are Student-t with this many degrees of freedom
    # An old measurement says less about the machine today: its noise variance
    # grows by one noise variance per this many days of age.
    age_days_per_noise: float = 30.0
    # The intervals' calibration on measured machines counts fully only once there are
    # many more machines than this (with few, the spreads' priors speak).
    interval_calibration_machines: float = 50.0
    # A measurement that says the CPU or the link was seen binding while it ran
    # (``Measurement.bottleneck``) is evidence of which of the two binds there: the
    # probability that the link does is a logistic of the link's doubling gain less the
    # CPU's (in log rate) over this. The two are what the measured rates alone confound
    # (a narrow link and few vCPUs cost a host alike; docs/discovery.md, section 2).
    observed_binding_temperature: float = 0.05
    # Rounds of the fit: parameters, spreads, host tails and (from the second) which
    # count of partitions in flight each measured slice holds.
    fit_rounds: int = 8


#: A RAM share may cost the whole rate by more than whole partitions in flight explain (a
#: host short of RAM pages, caches less, waits on its allocator): a smooth term in the
#: share, outside the soft-min, as hinges in log RAM below these shares (GiB), each with
#: its coefficient. Where the staircase explains the rate they stay near 0.
RAM_HINGES_GIB = (144.0, 192.0, 256.0, 384.0)
#: Where the RAM share is a factor read per GPU (``Priors.ram_form``), a share over the
#: GPUs may fall far below every deployable share: hinges there too.
RAM_PER_GPU_HINGES_GIB = (48.0, 96.0)
_HINGES = tuple(f"ram_hinge_{i}" for i in range(len(RAM_HINGES_GIB)))
_LOW_HINGES = tuple(f"ram_low_hinge_{i}" for i in range(len(RAM_PER_GPU_HINGES_GIB)))

#: How the RAM share may act (``Priors.ram_form``).
RAM_FORMS = ("choose", "capacity", "factor")

#: The parameters shared by every offer, in the order of the parameter vector.
FIXED = (
    "gpu_scale", "cpu_scale", "pcie_scale", "ram_scale", "ram_resident", "ram_partition",
    "ghz_exponent", "log_sharpness", "multi_gpu", "host_share", "mem_bw_deviation",
    "dlperf_deviation",
    "disk_bw", "inet_down", "reliability", "log_step_sharpness", "vcpu_exponent",
    "log_feed_sharpness", "shared_link", *_HINGES, "ram_per_gpu", *_LOW_HINGES,
)
_I = {name: i for i, name in enumerate(FIXED)}

#: The host every explanation is measured against (its rate is the explanation's start).
REFERENCE_OFFER = Offer(
    gpu_name="RTX 4090", num_gpus=1, gpu_mem_bw=1008.0,
    cpu_name="AMD EPYC 7543 32-Core Processor", cpu_cores=32,
    cpu_cores_effective=32, cpu_ghz=2.8, cpu_ram=257_000,
    pci_gen=4, gpu_lanes=16, pcie_bw=24.0,
    disk_bw=2000.0, inet_down=1000.0, reliability=0.99,
)

# Explanation groups: which design columns each moves (see _Design).
GROUPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("GPU model", ("g0", "gpu", "bwdev", "dldev")),
    ("GPU count", ("n_log",)),
    ("CPU share", ("cores_log", "ghz_log", "fam")),
    ("RAM share", ("ram_gib",)),
    ("PCIe", ("pcie_log", "shared_link")),
    ("sharing, disk, network", ("share_log", "z_disk", "z_inet", "z_rel")),
)


@dataclass(frozen=True, slots=True)
class Contribution:
    """How much one group of features moved the log rate from the reference host's."""

    name: str
    detail: str
    log_rate: float

    @property
    def factor(self) -> float:
        return math.exp(self.log_rate)


@dataclass(frozen=True, slots=True)
class Prediction:
    """A predicted true (steady-state) rate, its 80% interval and why."""

    # The point: the rate that minimises the expected absolute percentage error (the
    # median of the rate weighted by 1/rate; one log-normal: exp(mean - sd^2), a little
    # under the median; on a step of the partition count, the lower mode unless the
    # upper is twice as likely). docs/discovery.md, predictions.
    rate_per_hour: float
    rate_low: float  # 10th percentile
    rate_high: float  # 90th percentile
    log_rate_mean: float  # the mean of the log rate (over the modes, if several)
    log_rate_sd: float  # its sd, widened for the spreads' own uncertainty (Student t)
    bottleneck: str  # the capacity that binds: gpu, cpu, pcie, memory
    capacities_per_hour: dict[str, float]
    reference_rate_per_hour: float
    contributions: tuple[Contribution, ...]  # sum of log_rate = log(rate / reference)
    machine_runs: int  # measurements of this machine behind the prediction
    novelty: tuple[str, ...]  # what no measurement has covered yet
    assumed: tuple[str, ...]
    basis: str
    # (weight, log rate mean, log rate sd) of each mode when the rate has several (a
    # RAM share on a step of cuzk's partitions in flight); empty: one log-normal,
    # (log_rate_mean, log_rate_sd).
    modes: tuple[tuple[float, float, float], ...] = ()

    def components(self) -> tuple[tuple[float, float, float], ...]:
        """The log-normal modes of the rate: (weight, log mean, log sd), weights sum to 1."""
        return self.modes or ((1.0, self.log_rate_mean, self.log_rate_sd),)

    def probability_above(self, rate_per_hour: float) -> float:
        """P(true rate > rate_per_hour) under the prediction."""
        if rate_per_hour <= 0:
            return 1.0
        y = math.log(rate_per_hour)
        return sum(w * normal_sf((y - mu) / s) for w, mu, s in self.components())


@dataclass(frozen=True, slots=True)
class Unpredictable:
    """An offer the model cannot read: the reason names the field."""

    field: str
    reason: str


def normal_sf(x: float) -> float:
    """P(Z > x) for a standard normal Z."""
    return 0.5 * math.erfc(x / math.sqrt(2.0))


def t_quantile_90(dof: float) -> float:
    """The 90th percentile of Student's t (SciPy's; a dof under 1 counts as 1)."""
    return float(student_t.ppf(0.9, max(dof, 1.0)))


# --- design ------------------------------------------------------------------------------


@dataclass(slots=True)
class _Design:
    """Model inputs of N offers, one array per column (log units unless named z_)."""

    n_log: Array
    g0: Array  # log of the GPU class's anchor rate per card
    gpu: NDArray[np.int64]  # GPU model index, -1 when unmeasured
    bwdev: Array  # log(host's measured memory bandwidth / spec sheet)
    dldev: Array  # log(host's dlperf per GPU / its model's median)
    cores_log: Array
    ghz_log: Array
    fam: NDArray[np.int64]  # CPU family index, -1 when unmeasured
    ram_gib: Array
    pcie_log: Array
    shared_link: Array  # log(the host's GPUs) where the link is narrow, else 0
    share_log: Array
    z_disk: Array
    z_inet: Array
    z_rel: Array
    bw_assumed: NDArray[np.bool_]


def _design(
    feats: Sequence[OfferFeatures],
    priors: Priors,
    gpu_index: Mapping[str, int],
    fam_index: Mapping[str, int],
    dl_center: Mapping[str, float],
) -> _Design:
    def col(values: Sequence[float]) -> Array:
        return np.asarray(values, dtype=np.float64)

    g0, bwdev, dldev = [], [], []
    for f in feats:
        base = f.spec_mem_bw_gbps or f.mem_bw_gbps
        g0.append(math.log(priors.gpu_rate_per_hour * base / priors.gpu_ref_mem_bw_gbps))
        bwdev.append(math.log(f.mem_bw_gbps / f.spec_mem_bw_gbps) if f.spec_mem_bw_gbps else 0.0)
        center = dl_center.get(f.gpu_key)
        dldev.append(math.log(f.dlperf_per_gpu / center) if f.dlperf_per_gpu and center else 0.0)
    return _Design(
        n_log=col([math.log(f.num_gpus) for f in feats]),
        g0=col(g0),
        gpu=np.asarray([gpu_index.get(f.gpu_key, -1) for f in feats], dtype=np.int64),
        bwdev=np.clip(col(bwdev), -0.7, 0.7),
        dldev=np.clip(col(dldev), -0.7, 0.7),
        cores_log=col([math.log(max(f.cpu_cores_effective, 1.0)) for f in feats]),
        ghz_log=col([math.log(f.cpu_ghz / priors.cpu_ref_ghz) for f in feats]),
        fam=np.asarray([fam_index.get(f.cpu_family, -1) for f in feats], dtype=np.int64),
        ram_gib=col([f.ram_share_gib for f in feats]),
        pcie_log=col([math.log(max(f.pcie_gbps, 0.25)) for f in feats]),
        shared_link=col([math.log(max(1.0, round(f.num_gpus / max(f.host_share, 1e-3))))
                         if f.gpu_lanes is not None
                         and f.gpu_lanes <= priors.shared_link_max_lanes else 0.0
                         for f in feats]),
        share_log=col([math.log(max(f.host_share, 1e-3)) for f in feats]),
        z_disk=col([math.log(f.disk_bw_mbps / 2000.0) if f.disk_bw_mbps else 0.0 for f in feats]),
        z_inet=col([math.log(f.inet_down_mbps / 1000.0) if f.inet_down_mbps else 0.0
                    for f in feats]),
        z_rel=col([math.log(max(1.0 - f.reliability, 1e-3) / 0.01) if f.reliability is not None
                   else 0.0 for f in feats]),
        bw_assumed=np.asarray([any("bandwidth" in a for a in f.assumed) for f in feats]),
    )


def _rows(d: _Design, rows: NDArray[np.int64]) -> _Design:
    """The design of some rows."""
    return _Design(**{name: getattr(d, name)[rows] for name in d.__dataclass_fields__})


def _in_flight(ram_gib: Array, resident_gib: float, partition_gib: float,
               priors: Priors, k: float) -> tuple[Array, Array]:
    """(log partitions RAM holds in flight, d/dx) with x = (RAM - resident) / partition.

    cuzk admits whole partitions: each reserves its share of the memory budget before
    its synthesis, one is always admitted, and at most ``max_parallel_synthesis`` run
    at once (docs/cuzk.md). So the count is a staircase, floor(x) between 1 and that
    cap, here with smooth steps (a sum of logistic steps at 2, 3, ...), so the fit
    sees a slope and a host's hidden RAM shortfall blurs the step. This is the mean of
    ``_count_terms``' distribution: the explanations read it; the fit and the
    predictions read the distribution."""
    x = (ram_gib - resident_gib) / partition_gib
    steps = np.arange(2, _max_count(priors) + 1, dtype=np.float64)
    z = np.clip(k * (x[:, None] - steps[None, :]), -60.0, 60.0)
    sig = 1.0 / (1.0 + np.exp(-z))
    count = 1.0 + sig.sum(axis=1)
    slope = (k * sig * (1.0 - sig)).sum(axis=1)
    return np.log(count), slope / count


def _max_count(priors: Priors) -> int:
    """The most partitions in flight the count may take: cuzk's cap where the RAM share
    is a capacity; one where it is a factor on the whole rate (no count to infer)."""
    return priors.max_partitions_in_flight if priors.ram_form != "factor" else 1


def _count_terms(x: Array, k: Array | float, cmax: int) -> tuple[Array, Array, Array]:
    """(P(count = c), its derivative in x, its derivative in log k), each (N, cmax),
    c = 1..cmax, with x = (RAM share - resident) / partition.

    The staircase's smooth steps read as a distribution: each step is a logistic in the
    RAM the host leaves cuzk (which its offer does not show), so P(count >= c) =
    sigmoid(k (x - c)), and the smooth count of ``_in_flight`` is this distribution's
    mean. Near a step a host holds one count or the next, never the mean between them:
    its rate has two modes (a 128 GB share holds one partition or two, a factor of two).
    """
    steps = np.arange(2, cmax + 1, dtype=np.float64)
    kk = np.broadcast_to(np.asarray(k, dtype=np.float64), x.shape)[:, None]
    u = x[:, None] - steps[None, :]
    a = 1.0 / (1.0 + np.exp(-np.clip(kk * u, -60.0, 60.0)))
    da = a * (1.0 - a)
    n = x.shape[0]
    one, zero = np.ones((n, 1)), np.zeros((n, 1))
    at_least = np.hstack([one, a, zero])
    d_x = np.hstack([zero, kk * da, zero])
    d_k = np.hstack([zero, kk * u * da, zero])
    prob = np.maximum(at_least[:, :-1] - at_least[:, 1:], 0.0)
    return prob, d_x[:, :-1] - d_x[:, 1:], d_k[:, :-1] - d_k[:, 1:]


def _mixture_cdf(y: Array, weights: Array, means: Array, sd: Array) -> Array:
    """P(log rate <= y) per row of a mixture of normals with one sd per row."""
    z = (y[:, None] - means) / sd[:, None]
    tail: Array = special.erfc(-z / math.sqrt(2.0))
    out: Array = (weights * 0.5 * tail).sum(axis=1)
    return out


def _mixture_quantile(q: float, weights: Array, means: Array, sd: Array) -> Array:
    """The q-quantile per row of a mixture of normals (SciPy's bracketed root finder,
    vectorised over rows, to 1e-9 of an sd)."""
    def below(y: Array, row: NDArray[np.int64]) -> Array:
        # The finder drops rows as they converge and passes the rows still open.
        return _mixture_cdf(y, weights[row], means[row], sd[row]) - q

    found = elementwise.find_root(
        below, (means.min(axis=1) - 8.0 * sd, means.max(axis=1) + 8.0 * sd),
        args=(np.arange(sd.shape[0]),), tolerances={"xatol": 1e-9 * float(sd.min()), "xrtol": 0.0})
    out: Array = found.x
    return out


#: A partition count less likely than this is left out of an offer's modes.
MODE_MIN_WEIGHT = 1e-3


def _least_scale(y: Array, weights: Array, means: Array, y_sd: Array, sd: Array) -> Array:
    """Per row, the least factor on ``sd`` (within 0.05-20) that puts ``y`` inside the
    mixture's 10-90% interval (SciPy's bracketed root finder on the log factor)."""
    def margin(log_scale: Array, row: NDArray[np.int64]) -> Array:
        spread = np.sqrt((sd[row] * np.exp(log_scale)) ** 2 + y_sd[row] ** 2)
        return 0.4 - np.abs(_mixture_cdf(y[row], weights[row], means[row], spread) - 0.5)

    lo, hi = np.full(y.shape, math.log(0.05)), np.full(y.shape, math.log(20.0))
    rows = np.arange(y.shape[0])
    at_lo, at_hi = margin(lo, rows) >= 0, margin(hi, rows) < 0
    # A row inside already at the least factor keeps it; one outside even at the most, that.
    open_rows = rows[~at_lo & ~at_hi]
    log_scale = np.where(at_lo, lo, hi)
    if open_rows.size:
        found = elementwise.find_root(margin, (lo[open_rows], hi[open_rows]),
                                      args=(open_rows,), tolerances={"xatol": 1e-6, "xrtol": 0.0})
        log_scale[open_rows] = found.x
    out: Array = np.exp(log_scale)
    return out


def _ram_calibration(priors: Priors) -> float:
    """log(cuzk's table rate at 128 GiB / Little's law's rate there, unscaled)."""
    log_in_flight, _ = _in_flight(np.array([priors.ram_table_gib]), priors.ram_resident_gib,
                                  priors.ram_partition_gib, priors,
                                  priors.partition_step_sharpness)
    hold_s = (priors.synth_seconds_per_partition
              + priors.upload_gb_per_partition / priors.ram_table_pcie_gbps)
    return math.log(priors.ram_table_rate_per_hour * hold_s / 360.0) - float(log_in_flight[0])


@dataclass(slots=True)
class _Eval:
    f: Array  # log rate without the host effect
    caps: Array  # (N, 4) log capacities
    w: Array  # (N, 4) soft-min weights (which capacity binds)
    jac: Array | None  # (N, P)


def _evaluate(theta: Array, d: _Design, priors: Priors, n_gpu: int, n_fam: int,
              *, jacobian: bool, log_count: Array | None = None,
              cpu_boost: float = 0.0) -> _Eval:
    """The log rate of every row (and its Jacobian). ``log_count`` gives each row's
    partitions in flight (log: one count, or the mean log over a distribution of them,
    ``_count_terms``), as the fit and the predictions do; without it the count is the
    smooth staircase's (``_in_flight``), which the explanations read."""
    nf = len(FIXED)
    delta_gpu = np.concatenate([theta[nf:nf + n_gpu], [0.0]])  # index -1 -> 0
    delta_fam = np.concatenate([theta[nf + n_gpu:nf + n_gpu + n_fam], [0.0]])
    t = theta
    speed = t[_I["ghz_exponent"]] * d.ghz_log + delta_fam[d.fam] + cpu_boost
    caps = np.empty((d.n_log.shape[0], 4))
    caps[:, 0] = (d.n_log + d.g0 + t[_I["gpu_scale"]] + delta_gpu[d.gpu]
                  + t[_I["mem_bw_deviation"]] * d.bwdev + t[_I["dlperf_deviation"]] * d.dldev)
    ref_vcpus = math.log(priors.cpu_ref_vcpus)
    caps[:, 1] = (t[_I["vcpu_exponent"]] * (d.cores_log - ref_vcpus)
                  + math.log(priors.cpu_rate_per_vcpu_hour * priors.cpu_ref_vcpus)
                  + t[_I["cpu_scale"]] + speed)
    pcie_log = d.pcie_log - t[_I["shared_link"]] * d.shared_link
    caps[:, 2] = (d.n_log + pcie_log + math.log(priors.pcie_rate_per_gbps_hour)
                  + t[_I["pcie_scale"]])
    synth_s = priors.synth_seconds_per_partition * np.exp(-speed)
    upload_s = priors.upload_gb_per_partition * math.exp(-t[_I["pcie_scale"]]) / np.exp(pcie_log)
    hold_s = synth_s + upload_s
    resident = priors.ram_resident_gib + 10.0 * t[_I["ram_resident"]]
    partition = priors.ram_partition_gib * math.exp(t[_I["ram_partition"]])
    if log_count is None:
        log_in_flight, d_in_flight = _in_flight(d.ram_gib, resident, partition, priors,
                                                math.exp(t[_I["log_step_sharpness"]]))
    else:
        log_in_flight, d_in_flight = log_count, np.zeros_like(log_count)
    caps[:, 3] = (log_in_flight + math.log(360.0) - np.log(hold_s) + _ram_calibration(priors)
                  + t[_I["ram_scale"]])
    factor = priors.ram_form == "factor"
    soft, w, u, v, outer, feed = _bind(caps, t, factor)
    names, hinges = _hinge_terms(t, d, factor)
    coefs = t[[_I[h] for h in names]]
    f = (soft + hinges @ coefs
         + t[_I["multi_gpu"]] * d.n_log + t[_I["host_share"]] * d.share_log
         + t[_I["disk_bw"]] * d.z_disk + t[_I["inet_down"]] * d.z_inet
         + t[_I["reliability"]] * d.z_rel)
    jac = None
    if jacobian:
        n = f.shape[0]
        jac = np.zeros((n, nf + n_gpu + n_fam))
        synth_share = synth_s / hold_s
        w_speed = w[:, 1] + w[:, 3] * synth_share
        jac[:, _I["gpu_scale"]] = w[:, 0]
        jac[:, _I["cpu_scale"]] = w[:, 1]
        jac[:, _I["pcie_scale"]] = w[:, 2] + w[:, 3] * (1.0 - synth_share)
        jac[:, _I["shared_link"]] = -d.shared_link * jac[:, _I["pcie_scale"]]
        jac[:, _I["ram_scale"]] = w[:, 3]
        jac[:, _I["ram_resident"]] = w[:, 3] * d_in_flight * (-10.0 / partition)
        jac[:, _I["ram_partition"]] = w[:, 3] * d_in_flight * (-(d.ram_gib - resident) / partition)
        jac[:, _I["ghz_exponent"]] = w_speed * d.ghz_log
        jac[:, _I["log_sharpness"]] = (u * outer).sum(axis=1) - soft
        jac[:, _I["log_feed_sharpness"]] = u[:, 0] * ((v * caps[:, [0, 2]]).sum(axis=1) - feed)
        jac[:, _I["vcpu_exponent"]] = w[:, 1] * (d.cores_log - ref_vcpus)
        for j, h in enumerate(names):
            jac[:, _I[h]] = hinges[:, j]
        if factor:
            jac[:, _I["ram_per_gpu"]] = ((hinges > 0.0) @ coefs) * d.n_log
        jac[:, _I["multi_gpu"]] = d.n_log
        jac[:, _I["host_share"]] = d.share_log
        jac[:, _I["mem_bw_deviation"]] = w[:, 0] * d.bwdev
        jac[:, _I["dlperf_deviation"]] = w[:, 0] * d.dldev
        jac[:, _I["disk_bw"]] = d.z_disk
        jac[:, _I["inet_down"]] = d.z_inet
        jac[:, _I["reliability"]] = d.z_rel
        rows = np.arange(n)
        known = d.gpu >= 0
        jac[rows[known], nf + d.gpu[known]] = w[known, 0]
        known = d.fam >= 0
        jac[rows[known], nf + n_gpu + d.fam[known]] = w_speed[known]
    return _Eval(f, caps, w, jac)


def _bind(caps: Array, t: Array, factor: bool
          ) -> tuple[Array, Array, Array, Array, Array, Array]:
    """The fed GPUs (a soft-min of the GPUs and their link), then a soft-min of that, the
    CPU and the RAM (with the RAM a factor, no limit of its own: it acts through the
    RAM-share term alone). Returns the soft-min, w (each capacity's share of the binding,
    d f / d log cap), and the outer and inner weights and inputs the Jacobian reads."""
    feed, v = _softmin(caps[:, [0, 2]], math.exp(t[_I["log_feed_sharpness"]]))
    if factor:
        outer = np.stack([feed, caps[:, 1]], axis=1)
        soft, u = _softmin(outer, math.exp(t[_I["log_sharpness"]]))
        u = np.hstack([u, np.zeros((u.shape[0], 1))])
        outer = np.hstack([outer, caps[:, [3]]])
    else:
        outer = np.stack([feed, caps[:, 1], caps[:, 3]], axis=1)
        soft, u = _softmin(outer, math.exp(t[_I["log_sharpness"]]))
    w = np.stack([u[:, 0] * v[:, 0], u[:, 1], u[:, 0] * v[:, 1], u[:, 2]], axis=1)
    return soft, w, u, v, outer, feed


def _hinge_terms(t: Array, d: _Design, factor: bool) -> tuple[tuple[str, ...], Array]:
    """The RAM hinges' parameter names and columns: with the RAM a factor, read per
    GPU^e and with the per-GPU knots added."""
    if not factor:
        return _HINGES, _ram_hinges(d.ram_gib)
    return _HINGES + _LOW_HINGES, _ram_hinges(d.ram_gib, t[_I["ram_per_gpu"]] * d.n_log,
                                              RAM_HINGES_GIB + RAM_PER_GPU_HINGES_GIB)


def _ram_hinges(ram_gib: Array, shift_log: Array | float = 0.0,
                knots_gib: tuple[float, ...] = RAM_HINGES_GIB) -> Array:
    """(N, hinges): how far (in log) each RAM share, divided by exp(``shift_log``), lies
    below each knot (GiB; 0 at or above it)."""
    knots = np.log(np.asarray(knots_gib))
    at = np.log(np.maximum(ram_gib, 1.0)) - shift_log
    out: Array = np.maximum(0.0, knots[None, :] - np.broadcast_to(at, ram_gib.shape)[:, None])
    return out


def _softmin(logs: Array, kappa: float) -> tuple[Array, Array]:
    """(soft minimum of each row, its weights: the derivative in each column), a p-norm of
    the capacities with p = kappa: -log(sum(exp(-kappa logs))) / kappa."""
    low = logs.min(axis=1)
    e = np.exp(-kappa * (logs - low[:, None]))
    s = e.sum(axis=1)
    return low - np.log(s) / kappa, e / s[:, None]


def _doubling_gains(theta: Array, d: _Design, priors: Priors, n_gpu: int, n_fam: int
                    ) -> Array:
    """(N, 4) how much each resource doubled would raise each row's log rate (RESOURCES'
    order): the GPUs' speed, the CPU's speed (its capacity and each partition's
    synthesis), the link's bandwidth (its capacity and each partition's upload), the RAM
    share (partitions in flight, on the smooth staircase, and the RAM-share term).

    The binding resource is the one whose doubling raises the rate most: a question of
    the whole prediction, not of one term's weight, where terms meet softly (two limits
    near each other) or a resource also acts outside the soft-min (RAM)."""
    ln2 = math.log(2.0)

    def rate(dd: _Design, cpu_boost: float = 0.0) -> Array:
        return _evaluate(theta, dd, priors, n_gpu, n_fam, jacobian=False,
                         cpu_boost=cpu_boost).f

    def shifted(**cols: Array) -> _Design:
        return _Design(**{**{k: getattr(d, k) for k in d.__dataclass_fields__}, **cols})

    base = rate(d)
    return np.stack([
        rate(shifted(g0=d.g0 + ln2)) - base,
        rate(d, cpu_boost=ln2) - base,
        rate(shifted(pcie_log=d.pcie_log + ln2)) - base,
        rate(shifted(ram_gib=d.ram_gib * 2.0)) - base,
    ], axis=1)


def _ram_steps(theta: Array, priors: Priors) -> tuple[float, float]:
    """(resident GiB, GiB a partition) at these parameters."""
    return (priors.ram_resident_gib + 10.0 * theta[_I["ram_resident"]],
            priors.ram_partition_gib * math.exp(theta[_I["ram_partition"]]))


def _step_position(theta: Array, ram_gib: Array, priors: Priors) -> tuple[Array, Array]:
    """(x, dx/d(ram_resident, ram_partition)) with x = (RAM share - resident) / partition."""
    resident, partition = _ram_steps(theta, priors)
    x = (ram_gib - resident) / partition
    return x, np.stack([np.full_like(x, -10.0 / partition), -x], axis=1)


def _modes(theta: Array, cov: Array | None, d: _Design, priors: Priors, n_gpu: int,
           n_fam: int) -> tuple[Array, Array]:
    """(weights, log rates), each (N, max count): a new host's rate for each count of
    partitions in flight, with that count's probability (``_count_terms``; with the
    parameters' covariance, the steps widen for the doubt in where they are: a normal
    doubt in x added to the logistic's variance). Counts less likely than
    ``MODE_MIN_WEIGHT`` get weight 0, the rest renormalised."""
    x, dx = _step_position(theta, d.ram_gib, priors)
    k = math.exp(theta[_I["log_step_sharpness"]])
    k_eff: Array | float = k
    if cov is not None:
        idx = [_I["ram_resident"], _I["ram_partition"]]
        var_x = np.einsum("ij,jk,ik->i", dx, cov[np.ix_(idx, idx)], dx)
        k_eff = k / np.sqrt(1.0 + k * k * var_x * 3.0 / math.pi**2)
    weights = _count_terms(x, k_eff, _max_count(priors))[0]
    weights = np.where(weights >= MODE_MIN_WEIGHT, weights, 0.0)
    weights /= weights.sum(axis=1, keepdims=True)
    return weights, _count_rates(theta, d, priors, n_gpu, n_fam, weights > 0)


def _count_rates(theta: Array, d: _Design, priors: Priors, n_gpu: int, n_fam: int,
                 wanted: NDArray[np.bool_]) -> Array:
    """(N, max count) every row's log rate at each count of partitions in flight (only
    where ``wanted``; 0 elsewhere)."""
    out = np.zeros(wanted.shape)
    n = wanted.shape[0]
    for c in range(wanted.shape[1]):
        if wanted[:, c].any():
            log_count = np.full(n, math.log(c + 1.0))
            out[:, c] = _evaluate(theta, d, priors, n_gpu, n_fam, jacobian=False,
                                  log_count=log_count).f
    return out


# --- the fitted model ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Machine:
    runs: int
    effect: float  # posterior mean of the host effect (log rate)
    variance: float  # its posterior variance given the parameters
    gradient: Array  # d(effect)/d(theta): the effect moves with the parameters


@dataclass(frozen=True)
class RateModel:
    """A fitted rate model: ``predict`` any offer; ``summary`` for the operator."""

    priors: Priors
    theta: Array
    cov: Array
    gpu_index: Mapping[str, int]
    fam_index: Mapping[str, int]
    dl_center: Mapping[str, float]
    machines: Mapping[str, _Machine]
    sigma_noise: float
    sigma_host: float
    dof: float
    n_measurements: int
    gpu_runs: Mapping[str, int] = field(default_factory=dict)
    family_runs: Mapping[str, int] = field(default_factory=dict)
    iterations: int = 0
    interval_scale: float = 1.0  # a new host's interval, calibrated on measured machines
    # The same, for hosts bound by each capacity (gpu, cpu, pcie, memory); one missing
    # here takes ``interval_scale``.
    interval_scales: Mapping[str, float] = field(default_factory=dict)
    # Each measured slice's mean log count of partitions in flight, as its runs told:
    # (machine id, RAM share GiB to 0.1) -> log count.
    slice_log_counts: Mapping[tuple[str, float], float] = field(default_factory=dict)
    # Measurements whose binding resource was seen as the CPU or the link (what the fit
    # reads of ``Measurement.bottleneck``).
    bindings_seen: int = 0

    @property
    def n_machines(self) -> int:
        return len(self.machines)

    def parameter(self, name: str) -> tuple[float, float]:
        """A shared parameter's posterior mean and sd (names in ``FIXED``)."""
        i = _I[name]
        return float(self.theta[i]), float(math.sqrt(self.cov[i, i]))

    def summary(self) -> dict[str, Any]:
        """What the fit learned, in units an operator can check against the docs."""
        p = self.priors

        def scaled(name: str, anchor: float) -> float:
            return anchor * math.exp(self.parameter(name)[0])

        return {
            "measurements": self.n_measurements,
            "machines": self.n_machines,
            "bindings_seen": self.bindings_seen,
            "sigma_host": self.sigma_host,
            "sigma_noise": self.sigma_noise,
            "interval_scale": self.interval_scale,
            "interval_scales": dict(self.interval_scales),
            "gpu_rate_per_hour_at_896_gbps": scaled("gpu_scale", p.gpu_rate_per_hour),
            "cpu_rate_per_vcpu_hour_at_ref_ghz": scaled("cpu_scale", p.cpu_rate_per_vcpu_hour),
            "pcie_rate_per_gbps_hour": scaled("pcie_scale", p.pcie_rate_per_gbps_hour),
            "ram_scale": math.exp(self.parameter("ram_scale")[0]),
            "ram_resident_gib": p.ram_resident_gib + 10 * self.parameter("ram_resident")[0],
            "ram_partition_gib": p.ram_partition_gib * math.exp(self.parameter("ram_partition")[0]),
            "ghz_exponent": self.parameter("ghz_exponent")[0],
            "softmin_sharpness": math.exp(self.parameter("log_sharpness")[0]),
            "gpu_pcie_softmin_sharpness": math.exp(self.parameter("log_feed_sharpness")[0]),
            "vcpu_exponent": self.parameter("vcpu_exponent")[0],
            "shared_link_exponent": self.parameter("shared_link")[0],
            "ram_form": p.ram_form,
            "ram_per_gpu_exponent": self.parameter("ram_per_gpu")[0],
            "ram_share_term_at_128_gib": float(
                _ram_hinges(np.array([128.0]))[0] @ self.theta[[_I[h] for h in _HINGES]]),
            "gpu_models": {
                k: math.exp(self.theta[len(FIXED) + i]) for k, i in self.gpu_index.items()
            },
            "cpu_families": {
                k: math.exp(self.theta[len(FIXED) + len(self.gpu_index) + i])
                for k, i in self.fam_index.items()
            },
        }

    # --- prediction ---

    def predict(self, offer: Offer) -> Prediction:
        """One offer's prediction; FeatureError names a field it cannot read."""
        out = self.predict_features([offer_features(offer)], explain=True)
        return out[0]

    def predict_offers(
        self, offers: Sequence[Offer], *, explain: bool = True
    ) -> list[Prediction | Unpredictable]:
        """Every offer's prediction, or why it has none (a field it cannot read)."""
        feats: list[OfferFeatures] = []
        where: list[int] = []
        out: list[Prediction | Unpredictable | None] = [None] * len(offers)
        for i, offer in enumerate(offers):
            try:
                feats.append(offer_features(offer))
                where.append(i)
            except FeatureError as exc:
                out[i] = Unpredictable(exc.field, exc.message)
        for i, pred in zip(where, self.predict_features(feats, explain=explain), strict=True):
            out[i] = pred
        return [p for p in out if p is not None]

    def predict_features(
        self, feats: Sequence[OfferFeatures], *, explain: bool = True
    ) -> list[Prediction]:
        if not feats:
            return []
        with threadpool_limits(1, "blas"):
            return self._predict(feats, explain)

    def _predict(self, feats: Sequence[OfferFeatures], explain: bool) -> list[Prediction]:
        p = self.priors
        n_gpu, n_fam = len(self.gpu_index), len(self.fam_index)
        d = _design(feats, p, self.gpu_index, self.fam_index, self.dl_center)
        # Partitions in flight: a slice the fleet measured holds the count its runs
        # told; any other, each count the staircase allows near its RAM share, with its
        # probability (several on a step: the rate has a mode for each).
        weights, means = _modes(self.theta, self.cov, d, p, n_gpu, n_fam)
        log_count = weights @ np.log(np.arange(1.0, weights.shape[1] + 1.0))
        known = np.zeros(len(feats), dtype=np.bool_)
        for i, f in enumerate(feats):
            told = (self.slice_log_counts.get((f.machine_id, _slice_key(f)))
                    if f.machine_id is not None else None)
            if told is not None:
                log_count[i], known[i] = told, True
        ev = _evaluate(self.theta, d, p, n_gpu, n_fam, jacobian=True, log_count=log_count)
        binding = np.argmax(_doubling_gains(self.theta, d, p, n_gpu, n_fam), axis=1)
        b = self._bands(feats, d, ev, weights, means, known)
        shap = self._shapley(d, n_gpu, n_fam) if explain else None
        ref_log = self._reference_log_rate(n_gpu, n_fam) if explain else float("nan")
        # The explanation's groups move the smooth staircase's rate; what whole
        # partitions make of it (one count, or the modes) is a term of its own, and so
        # is the doubt (the point sits sd^2 below a log-normal's median: the rate with
        # the least expected percentage error).
        smooth = (_evaluate(self.theta, d, p, n_gpu, n_fam, jacobian=False).f if explain
                  else b.mean)
        preds = []
        for i, f in enumerate(feats):
            contributions: tuple[Contribution, ...] = ()
            if shap is not None:
                contributions = tuple(
                    Contribution(name, _detail(name, f), float(shap[i, g]))
                    for g, (name, _) in enumerate(GROUPS)
                ) + _own_terms(b, i, weights[i], bool(known[i]), float(log_count[i]),
                               float(smooth[i]))
            pred = self._prediction(f, i, b, ev, weights, means, contributions,
                                    math.exp(ref_log) if explain else float("nan"),
                                    RESOURCES[int(binding[i])])
            preds.append(with_basis(pred, f) if explain else pred)
        return preds

    def _bands(self, feats: Sequence[OfferFeatures], d: _Design, ev: _Eval,
               weights: Array, means: Array, known: NDArray[np.bool_]) -> _Bands:
        """Each offer's point, 80% interval and log-rate sd, with its machine's own effect
        where it was measured."""
        p = self.priors
        assert ev.jac is not None
        grad = ev.jac.copy()
        mean = ev.f.copy()
        var_extra = np.where(d.gpu < 0, ev.w[:, 0] ** 2 * p.gpu_model_sd**2, 0.0)
        var_extra += np.where(d.fam < 0, (ev.w[:, 1] + ev.w[:, 3]) ** 2 * p.cpu_family_sd**2, 0.0)
        var_extra += np.where(d.bw_assumed, ev.w[:, 0] ** 2 * 0.5**2, 0.0)
        effects = np.zeros(len(feats))
        runs = np.zeros(len(feats), dtype=np.int64)
        # A new host's effect is t-distributed, a measured one's posterior is normal:
        # the interval's half-width adds the two parts' 90th percentiles in quadrature.
        host_q = np.full(len(feats), t_quantile_90(p.host_tail_dof) * self.sigma_host)
        for i, f in enumerate(feats):
            m = self.machines.get(f.machine_id) if f.machine_id is not None else None
            if m is not None:
                effects[i] = m.effect
                runs[i] = m.runs
                host_q[i] = Z80 * math.sqrt(m.variance)
                grad[i] += m.gradient
        mean += effects
        var = np.einsum("ij,jk,ik->i", grad, self.cov, grad) + var_extra
        half = np.sqrt(Z80**2 * var + host_q**2) * (t_quantile_90(self.dof) / Z80)
        bound = np.argmax(ev.w, axis=1)
        new_scale = np.array([self.interval_scales.get(RESOURCES[j], self.interval_scale)
                              for j in bound])
        half = np.where(runs > 0, half, half * new_scale)
        sd = half / Z80
        # The point minimises the expected absolute percentage error: the median of the
        # rate's density times 1/rate. For a normal log rate (mean m, sd s) that density
        # is again log-normal, mean m - s^2, weight exp(-m + s^2/2).
        point = mean - sd * sd
        low, high = mean - Z80 * sd, mean + Z80 * sd
        # On a step of the partition count the rate has two (or more) modes: the
        # interval and the point are the mixture's (with this machine's effect, if its
        # other slices were measured).
        multi = ~known & ((weights > 0).sum(axis=1) > 1)
        if multi.any():
            w, m_, s_ = weights[multi], means[multi] + effects[multi, None], sd[multi]
            low[multi] = _mixture_quantile(0.1, w, m_, s_)
            high[multi] = _mixture_quantile(0.9, w, m_, s_)
            w_ape = w * np.exp(-(m_ - m_.max(axis=1, keepdims=True)))
            point[multi] = _mixture_quantile(0.5, w_ape / w_ape.sum(axis=1, keepdims=True),
                                             m_ - (s_**2)[:, None], s_)
        return _Bands(mean, sd, point, low, high, effects, runs, multi)

    def _prediction(self, f: OfferFeatures, i: int, b: _Bands, ev: _Eval,
                    weights: Array, means: Array, contributions: tuple[Contribution, ...],
                    reference: float, bottleneck: str) -> Prediction:
        mu, s = float(b.mean[i]), float(b.sd[i])
        modes: tuple[tuple[float, float, float], ...] = ()
        if b.multi[i]:
            modes = tuple((float(weights[i, c]), float(means[i, c] + b.effects[i]), s)
                          for c in np.flatnonzero(weights[i]))
            mu = sum(wc * mc for wc, mc, _ in modes)
            s = math.sqrt(sum(wc * (s * s + (mc - mu) ** 2) for wc, mc, _ in modes))
        return Prediction(
            rate_per_hour=math.exp(float(b.point[i])),
            rate_low=math.exp(float(b.low[i])),
            rate_high=math.exp(float(b.high[i])),
            log_rate_mean=mu,
            log_rate_sd=s,
            bottleneck=bottleneck,
            # Where the RAM share is a factor on the whole rate it is no capacity.
            capacities_per_hour={r: float(math.exp(ev.caps[i, k]))
                                 for k, r in enumerate(RESOURCES)
                                 if r != "memory" or self.priors.ram_form != "factor"},
            reference_rate_per_hour=reference,
            contributions=contributions,
            machine_runs=int(b.runs[i]),
            novelty=self._novelty(f, int(b.runs[i])),
            assumed=f.assumed,
            basis="",
            modes=modes,
        )

    def _novelty(self, f: OfferFeatures, runs: int) -> tuple[str, ...]:
        if runs:
            return ()
        out = []
        if not self.gpu_runs.get(f.gpu_key):
            out.append(f"no {f.gpu_name} measured yet")
        if not self.family_runs.get(f.cpu_family):
            out.append(f"no {f.cpu_family} CPU measured yet")
        return tuple(out)

    def _reference_log_rate(self, n_gpu: int, n_fam: int) -> float:
        ref = _design([offer_features(REFERENCE_OFFER)], self.priors, self.gpu_index,
                      self.fam_index, self.dl_center)
        return float(_evaluate(self.theta, ref, self.priors, n_gpu, n_fam, jacobian=False).f[0])

    def _shapley(self, d: _Design, n_gpu: int, n_fam: int) -> Array:
        """(N, groups) exact Shapley shares of f(offer) - f(reference), in log rate."""
        ref = _design([offer_features(REFERENCE_OFFER)], self.priors, self.gpu_index,
                      self.fam_index, self.dl_center)
        n, g = d.n_log.shape[0], len(GROUPS)
        coalitions = list(itertools.product((0, 1), repeat=g))
        values = np.empty((len(coalitions), n))
        for c, mask in enumerate(coalitions):
            cols: dict[str, Any] = {}
            for (_, names), on in zip(GROUPS, mask, strict=True):
                for name in names:
                    cols[name] = getattr(d, name) if on else np.repeat(getattr(ref, name), n)
            cols["bw_assumed"] = d.bw_assumed
            mixed = _Design(**cols)
            values[c] = _evaluate(self.theta, mixed, self.priors, n_gpu, n_fam,
                                  jacobian=False).f
        index = {mask: c for c, mask in enumerate(coalitions)}
        phi = np.zeros((n, g))
        for mask, c in index.items():
            size = sum(mask)
            for k in range(g):
                if mask[k]:
                    continue
                with_k = (*mask[:k], 1, *mask[k + 1:])
                weight = math.factorial(size) * math.factorial(g - size - 1) / math.factorial(g)
                phi[:, k] += weight * (values[index[with_k]] - values[c])
        return phi


@dataclass(slots=True)
class _Bands:
    """Per offer: the log rate's mean and sd, the point and the 80% interval (log), the
    machine's own effect and runs, and whether the rate has several modes."""

    mean: Array
    sd: Array
    point: Array
    low: Array
    high: Array
    effects: Array
    runs: NDArray[np.int64]
    multi: NDArray[np.bool_]


def _own_terms(b: _Bands, i: int, weights: Array, known: bool, log_count: float,
               smooth: float) -> tuple[Contribution, ...]:
    """The explanation's terms past the groups: whole partitions, the doubt and this
    machine's own runs."""
    return (
        Contribution("partitions in flight", _count_detail(weights, known, log_count),
                     float(b.point[i] + b.sd[i] ** 2 - smooth - b.effects[i])),
        Contribution("doubt", f"(80% {math.exp(b.low[i]):.0f}-{math.exp(b.high[i]):.0f}/h)",
                     float(-b.sd[i] ** 2)),
    ) + ((Contribution("this machine's runs", f"{b.runs[i]} measured", float(b.effects[i])),)
         if b.runs[i] else ())


def _count_detail(weights: Array, known: bool, log_count: float) -> str:
    """The partitions in flight behind a prediction, in words."""
    if weights.shape[0] == 1:
        return "no limit (the RAM share a factor on the rate)"
    if known:
        return f"{math.exp(log_count):.1f} as measured"
    k = np.flatnonzero(weights)
    top = sorted(k[np.argsort(-weights[k])][:2])
    if len(top) == 1:
        return f"{top[0] + 1}"
    return " or ".join(f"{c + 1} ({weights[c]:.0%})" for c in top)


def _detail(group: str, f: OfferFeatures) -> str:
    if group == "GPU model":
        return f"{f.gpu_name} ({f.mem_bw_gbps:.0f} GB/s)"
    if group == "GPU count":
        return f"{f.num_gpus}x"
    if group == "CPU share":
        return f"{f.cpu_cores_effective:g} vCPU {f.cpu_family} at {f.cpu_ghz:.1f} GHz"
    if group == "RAM share":
        return f"{f.ram_share_gib:.0f} GiB"
    if group == "PCIe":
        return f"{f.pcie_gbps:.1f} GB/s per GPU"
    return f"host share {f.host_share:.2f}"


def with_basis(pred: Prediction, f: OfferFeatures) -> Prediction:
    """The one-line basis shown beside a prediction: interval, bottleneck, main factors."""
    moved = sorted(
        (c for c in pred.contributions
         if abs(c.log_rate) >= 0.03 and c.name != "this machine's runs"),
        key=lambda c: -abs(c.log_rate),
    )[:3]
    factors = ", ".join(f"{c.name} {c.detail} x{c.factor:.2f}" for c in moved)
    text = (
        f"{pred.rate_low:.0f}-{pred.rate_high:.0f}/h (80%), {pred.bottleneck}-bound; "
        f"vs reference {pred.reference_rate_per_hour:.0f}/h: {factors or 'as the reference'}"
    )
    if pred.machine_runs:
        own = next(c for c in pred.contributions if c.name == "this machine's runs")
        text += f"; this machine x{own.factor:.2f} over {pred.machine_runs} run(s)"
    if pred.novelty:
        text += "; " + "; ".join(pred.novelty)
    if f.assumed:
        text += "; " + "; ".join(f.assumed)
    return Prediction(**{**{k: getattr(pred, k) for k in pred.__dataclass_fields__},
                         "basis": text})


# --- fitting -----------------------------------------------------------------------------------


@dataclass(slots=True)
class _Data:
    y: Array  # log rates, rows sorted by machine
    q: Array  # per-measurement precision multiplier (older: less)
    starts: NDArray[np.int64]  # first row of each machine
    unit_starts: NDArray[np.int64]  # first row of each slice of a machine (its RAM share)


def _prior_arrays(priors: Priors, n_gpu: int, n_fam: int) -> tuple[Array, Array]:
    p = priors
    mean = {name: 0.0 for name in FIXED}
    mean["ghz_exponent"] = p.ghz_exponent
    mean["log_sharpness"] = math.log(p.sharpness)
    mean["mem_bw_deviation"] = p.deviation_coef
    mean["dlperf_deviation"] = p.deviation_coef
    mean["log_step_sharpness"] = math.log(p.partition_step_sharpness)
    mean["vcpu_exponent"] = p.vcpu_exponent
    mean["log_feed_sharpness"] = math.log(p.feed_sharpness)
    mean["shared_link"] = p.shared_link
    mean["multi_gpu"] = p.multi_gpu
    sd = {
        "gpu_scale": p.gpu_scale_sd, "cpu_scale": p.cpu_scale_sd, "pcie_scale": p.pcie_scale_sd,
        "ram_scale": p.ram_scale_sd, "ram_resident": p.ram_resident_sd,
        "ram_partition": p.ram_partition_sd, "ghz_exponent": p.ghz_exponent_sd,
        "log_sharpness": p.sharpness_sd, "multi_gpu": p.multi_gpu_sd, "host_share": p.linear_sd,
        "mem_bw_deviation": p.deviation_coef_sd, "dlperf_deviation": p.deviation_coef_sd,
        "disk_bw": p.other_sd, "inet_down": p.other_sd, "reliability": p.other_sd,
        "log_step_sharpness": p.partition_step_sharpness_sd,
        "vcpu_exponent": p.vcpu_exponent_sd, "log_feed_sharpness": p.feed_sharpness_sd,
        "shared_link": p.shared_link_sd,
        **{h: p.ram_hinge_sd for h in _HINGES + _LOW_HINGES}, "ram_per_gpu": p.ram_per_gpu_sd,
    }
    mu = np.array([mean[k] for k in FIXED] + [0.0] * (n_gpu + n_fam))
    sds = np.array([sd[k] for k in FIXED] + [p.gpu_model_sd] * n_gpu + [p.cpu_family_sd] * n_fam)
    return mu, 1.0 / sds**2


class _Posterior:
    """The block-marginal likelihood (host effects integrated out) at one theta."""

    def __init__(self, data: _Data, jac: Array, resid: Array) -> None:
        q = data.q
        self.qr2 = float((q * resid * resid).sum())
        self.qm = np.add.reduceat(q, data.starts)
        self.qrm = np.add.reduceat(q * resid, data.starts)
        self.jqj = jac.T @ (q[:, None] * jac)
        self.jqr = jac.T @ (q * resid)
        self.tq = np.add.reduceat(q[:, None] * jac, data.starts, axis=0)
        self.log_q = float(np.log(q).sum())
        self.n = resid.shape[0]

    def parts(
        self, sig_e: float, sig_h: float, weight: Array
    ) -> tuple[float, float, Array, Array, Array]:
        """(r'Wr, log|Sigma_y|, J'WJ, J'Wr, c per machine); machine m's host effect has
        variance sig_h^2 / weight[m] (the t-distribution's scale mixture)."""
        e2, h2 = sig_e**2, sig_h**2 / weight
        c = h2 / (1.0 + h2 * self.qm / e2)
        rwr = self.qr2 / e2 - float((c * (self.qrm / e2) ** 2).sum())
        logdet = self.n * math.log(e2) - self.log_q + float(np.log1p(h2 * self.qm / e2).sum())
        jwj = self.jqj / e2 - (self.tq.T * (c / e2**2)) @ self.tq
        jwr = self.jqr / e2 - self.tq.T @ (c * self.qrm / e2**2)
        return rwr, logdet, jwj, jwr, c


def _golden(fn: Callable[[float], float], lo: float, hi: float, tol: float = 0.01) -> float:
    """The maximiser of a unimodal fn on [lo, hi] (SciPy's bounded Brent search)."""
    found = optimize.minimize_scalar(lambda x: -fn(x), bounds=(lo, hi), method="bounded",
                                     options={"xatol": tol})
    return float(found.x)


def fit_rate_model(
    measurements: Sequence[Measurement],
    *,
    now: float | None = None,
    priors: Priors | None = None,
) -> RateModel:
    """The posterior given every measurement (none is fine: the facts alone).

    ``now`` (unix seconds) ages the measurements: an old one counts for less. No
    clock is read here.
    """
    p = priors or Priors()
    if p.ram_form not in RAM_FORMS:
        raise ValueError(f"ram_form {p.ram_form!r}: expected one of {', '.join(RAM_FORMS)}")
    # The matrices are small (parameters x parameters): BLAS threads only contend,
    # and on a shared two-core host they made the fit a hundred times slower.
    with threadpool_limits(1, "blas"):
        if p.ram_form != "choose":
            return _fit(measurements, now, p)[0]
        capacity, capacity_evidence = _fit(measurements, now, replace(p, ram_form="capacity"))
        if len({m.machine_id for m in measurements}) < p.ram_form_min_machines:
            return capacity
        # The RAM share as a factor on the whole rate instead of a limit (docs/discovery.md,
        # section 2): kept where the measurements make it the likelier form.
        factor, factor_evidence = _fit(measurements, now, replace(p, ram_form="factor"))
        return factor if factor_evidence > capacity_evidence else capacity


def _fit(measurements: Sequence[Measurement], now: float | None, p: Priors
         ) -> tuple[RateModel, float]:
    """The fit at these priors, and its log marginal likelihood (Laplace)."""
    # Rows by machine, then by slice (RAM share): a slice's runs share one count of
    # partitions in flight, so they are one block of rows (a "unit").
    pairs = sorted(((m, m.features()) for m in measurements),
                   key=lambda mf: (mf[0].machine_id, mf[1].ram_share_gib))
    ms = [m for m, _ in pairs]
    feats = [f for _, f in pairs]
    gpu_index = {k: i for i, k in enumerate(sorted({f.gpu_key for f in feats}))}
    fam_index = {k: i for i, k in enumerate(sorted({f.cpu_family for f in feats}))}
    dl: dict[str, list[float]] = {}
    gpu_runs: dict[str, int] = {}
    family_runs: dict[str, int] = {}
    for f in feats:
        if f.dlperf_per_gpu:
            dl.setdefault(f.gpu_key, []).append(f.dlperf_per_gpu)
        gpu_runs[f.gpu_key] = gpu_runs.get(f.gpu_key, 0) + 1
        family_runs[f.cpu_family] = family_runs.get(f.cpu_family, 0) + 1
    dl_center = {k: float(np.median(v)) for k, v in dl.items()}
    mu, prec = _prior_arrays(p, len(gpu_index), len(fam_index))
    if not ms:
        return RateModel(p, mu, np.diag(1.0 / prec), gpu_index, fam_index, dl_center, {},
                         p.noise_sd, p.host_sd, p.prior_dof, 0), 0.0

    machine_ids, starts, unit_keys, unit_starts = _blocks(pairs)
    ages_days = np.array([max(0.0, (now - m.measured_at) / 86400.0) if now is not None else 0.0
                          for m in ms])
    data = _Data(
        y=np.log(np.array([m.rate_per_hour for m in ms])),
        q=1.0 / (1.0 + ages_days / p.age_days_per_noise),
        starts=np.asarray(starts, dtype=np.int64),
        unit_starts=np.asarray(unit_starts, dtype=np.int64),
    )
    fitter = _Fitter(p, _design(feats, p, gpu_index, fam_index, dl_center), data, mu, prec,
                     len(gpu_index), len(fam_index))
    seen = [(i, m.bottleneck == "pcie") for i, m in enumerate(ms)
            if m.bottleneck in ("cpu", "pcie")]
    fitter.seen_rows = np.asarray([i for i, _ in seen], dtype=np.int64)
    fitter.seen_link = np.asarray([float(link) for _, link in seen])
    for round_ in range(p.fit_rounds):
        if round_:
            fitter.update_counts()
        fitter.fit_theta()
        fitter.fit_spreads()
        fitter.update_weights()

    post = fitter.posterior(fitter.theta)
    _, _, jwj, _, c = post.parts(fitter.sig_e, fitter.sig_h, fitter.weight)
    cov: Array = np.asarray(np.linalg.inv(jwj + np.diag(prec) + fitter.count_terms(
        fitter.theta)[1] + fitter.seen_terms(fitter.theta)[2]), dtype=np.float64)
    e2 = fitter.sig_e**2
    runs = np.diff(np.append(data.starts, len(ms)))
    machines = {
        mid: _Machine(
            runs=int(runs[k]),
            effect=float(c[k] * post.qrm[k] / e2),
            variance=float(c[k]),
            gradient=-c[k] * post.tq[k] / e2,
        )
        for k, mid in enumerate(machine_ids)
    }
    unit_log_count = fitter.resp @ fitter.log_counts
    p_eff = float(np.trace(cov @ jwj))
    dof = max(len(machine_ids) - p_eff, 0.0) + p.prior_dof
    scale, scales = _interval_scales(fitter, post, cov, dof, p_eff)
    model = RateModel(
        priors=p, theta=fitter.theta, cov=cov, gpu_index=gpu_index, fam_index=fam_index,
        dl_center=dl_center, machines=machines, sigma_noise=fitter.sig_e,
        sigma_host=fitter.sig_h, dof=dof,
        n_measurements=len(ms), gpu_runs=gpu_runs, family_runs=family_runs,
        iterations=fitter.iterations,
        interval_scale=scale,
        interval_scales=scales,
        slice_log_counts={key: float(v) for key, v in zip(unit_keys, unit_log_count,
                                                          strict=True)},
        bindings_seen=len(seen),
    )
    return model, fitter.log_evidence()


def _blocks(pairs: Sequence[tuple[Measurement, OfferFeatures]],
            ) -> tuple[list[str], list[int], list[tuple[str, float]], list[int]]:
    """The machines and where their rows start; the units (a machine's slice) and theirs."""
    machine_ids: list[str] = []
    starts: list[int] = []
    unit_keys: list[tuple[str, float]] = []
    unit_starts: list[int] = []
    for i, (m, f) in enumerate(pairs):
        if not machine_ids or machine_ids[-1] != m.machine_id:
            machine_ids.append(m.machine_id)
            starts.append(i)
        key = (m.machine_id, _slice_key(f))
        if not unit_keys or unit_keys[-1] != key:
            unit_keys.append(key)
            unit_starts.append(i)
    return machine_ids, starts, unit_keys, unit_starts


def _slice_key(f: OfferFeatures) -> float:
    """A slice of a machine, by its RAM share (GiB, to 0.1)."""
    return round(f.ram_share_gib, 1)


def _interval_scales(fitter: _Fitter, post: _Posterior, cov: Array, dof: float,
                     p_eff: float) -> tuple[float, dict[str, float]]:
    """How much a new host's 80% interval must widen (or narrow) so that it would have
    held 80% of the measured machines' rates: the fleet's own machines calibrate it.
    One scale for all, and one for each binding capacity (Mondrian calibration: a
    GPU-bound host's rate varies less than a CPU-bound one's, and one scale for both
    would be too wide for the one and too narrow for the other); a capacity's own
    scale counts fully only with well over ``interval_calibration_machines`` machines
    bound by it, and leans on the scale for all before.

    Each machine's first slice, its mean measured rate, is compared with the
    distribution its hardware would get as a new host (every count of partitions in
    flight it might hold, each a normal in log rate), widened by the benchmark noise of
    that mean: the least scale of the normals' sd that puts it inside that
    distribution's 80% interval, inflated for what its own measurements pulled the fit
    towards (leave-one-out, through the parameters spent). The benchmark noise is the
    spread between runs of one slice of one machine (pooled; none counted when no
    slice ran twice, which errs on the wide side): the fitted noise is no guide here, it
    holds the differences between slices of one machine too, which a new host's
    interval must cover. With few machines the scale stays near 1: the spreads' priors
    speak then.
    """
    machines = fitter.data.starts.shape[0]
    if machines < 2:
        return 1.0, {}
    p = fitter.p
    first = fitter.data.starts
    ev = _evaluate(fitter.theta, fitter.d, p, fitter.n_gpu, fitter.n_fam, jacobian=True,
                   log_count=fitter.row_log_count())
    assert ev.jac is not None
    rows = ev.jac[first]
    var = np.einsum("ij,jk,ik->i", rows, cov, rows)
    host_q = t_quantile_90(p.host_tail_dof) * fitter.sig_h
    sd = np.sqrt(Z80**2 * var + host_q**2) * (t_quantile_90(dof) / Z80) / Z80
    # Each machine's first slice: its rows are the first unit of the machine.
    q, resid = fitter.data.q, fitter.data.y - ev.f
    units = fitter.data.unit_starts
    unit_q = np.add.reduceat(q, units)
    unit_mean = np.add.reduceat(q * resid, units) / unit_q
    spread = float((q * (resid - unit_mean[fitter.unit_of_row]) ** 2).sum())
    repeats = resid.shape[0] - units.shape[0]
    noise_var = spread / repeats if repeats else 0.0
    first_unit = np.searchsorted(units, first)
    y = ev.f[first] + unit_mean[first_unit]
    y_var = noise_var / unit_q[first_unit]
    weights, means = _modes(fitter.theta, cov, _rows(fitter.d, first), p,
                            fitter.n_gpu, fitter.n_fam)
    least = _least_scale(y, weights, means, np.sqrt(y_var), sd)
    loo = 1.0 / math.sqrt(max(1.0 - p_eff / machines, 0.5))
    k = p.interval_calibration_machines

    def shrunk(values: Array, towards: float) -> float:
        observed = float(np.quantile(values, 0.8)) * loo
        weight = values.shape[0] / (values.shape[0] + k)
        return float(np.clip(towards + weight * (observed - towards), 0.5, 2.5))

    overall = shrunk(least, 1.0)
    bound = np.argmax(ev.w[first], axis=1)
    by_capacity = {name: shrunk(least[bound == j], overall)
                   for j, name in enumerate(RESOURCES) if (bound == j).any()}
    return overall, by_capacity


class _Fitter:
    """Maximum a posteriori parameters, spreads by evidence, host tails and partition
    counts by EM."""

    def __init__(self, priors: Priors, design: _Design, data: _Data, mu: Array, prec: Array,
                 n_gpu: int, n_fam: int) -> None:
        self.p, self.d, self.data, self.mu, self.prec = priors, design, data, mu, prec
        self.n_gpu, self.n_fam = n_gpu, n_fam
        self.theta = mu.copy()
        self.sig_e, self.sig_h = priors.noise_sd, priors.host_sd
        # Host effects are Student-t (a scale mixture of normals): a few hosts far off
        # their hardware's rate (a throttled card, a RAM cliff) must not widen every
        # other host's interval. weight[m] divides machine m's host variance.
        self.weight = np.ones(data.starts.shape[0])
        self.iterations = 0
        # Each slice's count of partitions in flight is latent: resp[u, c] is the
        # posterior probability that slice u holds c + 1 (the prior's at first).
        n = data.y.shape[0]
        self.unit_of_row = np.repeat(np.arange(data.unit_starts.shape[0]),
                                     np.diff(np.append(data.unit_starts, n)))
        self.unit_ram = design.ram_gib[data.unit_starts]
        self.log_counts = np.log(np.arange(1, _max_count(priors) + 1,
                                           dtype=np.float64))
        self.resp = self.count_weights(self.theta)
        # Rows measured with the CPU or the link seen binding: the rows, and 1 where it
        # was the link.
        self.seen_rows: NDArray[np.int64] = np.zeros(0, dtype=np.int64)
        self.seen_link: Array = np.zeros(0)

    def seen_loglik(self, theta: Array) -> float:
        """``seen_terms``' log likelihood alone (the line search's objective)."""
        if not self.seen_rows.shape[0]:
            return 0.0
        return self._seen_loglik_at(self._seen_z(theta, jacobian=False)[0])

    def _seen_loglik_at(self, z: Array) -> float:
        """The Bernoulli log likelihood of the seen bindings at logits ``z``."""
        return float((self.seen_link * z - np.logaddexp(0.0, z)).sum())

    def _seen_z(self, theta: Array, *, jacobian: bool) -> tuple[Array, Array | None]:
        """Each seen row's (the link's doubling gain less the CPU's) / temperature, and its
        Jacobian in theta (with ``jacobian``)."""
        d = _rows(self.d, self.seen_rows)
        tau = self.p.observed_binding_temperature
        ln2 = math.log(2.0)
        # The gains share the unshifted rate, so their difference is the two shifted ones'.
        cpu = _evaluate(theta, d, self.p, self.n_gpu, self.n_fam, jacobian=jacobian,
                        cpu_boost=ln2)
        link = _evaluate(theta, replace(d, pcie_log=d.pcie_log + ln2), self.p, self.n_gpu,
                         self.n_fam, jacobian=jacobian)
        if not jacobian:
            return (link.f - cpu.f) / tau, None
        assert cpu.jac is not None and link.jac is not None
        return (link.f - cpu.f) / tau, (link.jac - cpu.jac) / tau

    def seen_terms(self, theta: Array) -> tuple[float, Array, Array]:
        """(log likelihood, its gradient, its Fisher information) in theta of the
        bindings seen: for each such row, the logistic of (the link's doubling gain less
        the CPU's) / ``observed_binding_temperature`` is the probability the link binds."""
        size = theta.shape[0]
        if not self.seen_rows.shape[0]:
            return 0.0, np.zeros(size), np.zeros((size, size))
        z, dz = self._seen_z(theta, jacobian=True)
        assert dz is not None
        prob = special.expit(z)
        grad = dz.T @ (self.seen_link - prob)
        fisher = dz.T @ ((prob * (1.0 - prob))[:, None] * dz)
        return self._seen_loglik_at(z), grad, fisher

    def count_weights(self, theta: Array) -> Array:
        """(units, counts) the prior's probability of each count, the unlikely ones 0."""
        x, _ = _step_position(theta, self.unit_ram, self.p)
        k = math.exp(theta[_I["log_step_sharpness"]])
        prob = _count_terms(x, k, _max_count(self.p))[0]
        prob = np.where(prob >= MODE_MIN_WEIGHT, prob, 0.0)
        out: Array = prob / prob.sum(axis=1, keepdims=True)
        return out

    def row_log_count(self) -> Array:
        """Each row's mean log count of partitions in flight under ``resp``."""
        out: Array = (self.resp @ self.log_counts)[self.unit_of_row]
        return out

    def count_log_prior(self, theta: Array) -> float:
        """The sum over slices and counts of resp x log P(count) at theta."""
        x, _ = _step_position(theta, self.unit_ram, self.p)
        k = math.exp(theta[_I["log_step_sharpness"]])
        prob = _count_terms(x, k, _max_count(self.p))[0]
        r = self.resp
        return float(np.where(r > 0, r * np.log(np.maximum(prob, 1e-12)), 0.0).sum())

    def count_terms(self, theta: Array) -> tuple[Array, Array]:
        """(gradient, a positive curvature) in theta of ``count_log_prior``: what the
        slices' counts say about where the steps are (the resident RAM and the
        partition's size) and how sharp they are."""
        x, dx = _step_position(theta, self.unit_ram, self.p)
        k = math.exp(theta[_I["log_step_sharpness"]])
        prob, d_x, d_k = _count_terms(x, k, _max_count(self.p))
        r = self.resp
        safe = np.maximum(prob, 1e-12)
        # Scores of log P(count) in x and in log k; x moves with (ram_resident,
        # ram_partition) through dx.
        sx, sk = d_x / safe, d_k / safe
        gx, gk = (r * sx).sum(axis=1), (r * sk).sum(axis=1)
        xx, xk, kk = (r * sx * sx).sum(axis=1), (r * sx * sk).sum(axis=1), (r * sk * sk).sum(axis=1)
        a, b = dx[:, 0], dx[:, 1]
        grad3 = np.array([(gx * a).sum(), (gx * b).sum(), gk.sum()])
        curv3 = np.array([
            [(xx * a * a).sum(), (xx * a * b).sum(), (xk * a).sum()],
            [(xx * a * b).sum(), (xx * b * b).sum(), (xk * b).sum()],
            [(xk * a).sum(), (xk * b).sum(), kk.sum()],
        ])
        size = theta.shape[0]
        idx = [_I["ram_resident"], _I["ram_partition"], _I["log_step_sharpness"]]
        grad, curv = np.zeros(size), np.zeros((size, size))
        grad[idx] = grad3
        curv[np.ix_(idx, idx)] = curv3
        return grad, curv

    def posterior(self, theta: Array) -> _Posterior:
        ev = _evaluate(theta, self.d, self.p, self.n_gpu, self.n_fam, jacobian=True,
                       log_count=self.row_log_count())
        assert ev.jac is not None
        return _Posterior(self.data, ev.jac, self.data.y - ev.f)

    def objective(self, theta: Array, post: _Posterior) -> float:
        rwr = post.parts(self.sig_e, self.sig_h, self.weight)[0]
        return (0.5 * rwr + 0.5 * float((self.prec * (theta - self.mu) ** 2).sum())
                - self.count_log_prior(theta) - self.seen_loglik(theta))

    def fit_theta(self) -> None:
        """Levenberg-Marquardt on the parameters at the current spreads and counts."""
        post = self.posterior(self.theta)
        obj = self.objective(self.theta, post)
        damping = 1e-3
        for _ in range(60):
            self.iterations += 1
            _, _, jwj, jwr, _ = post.parts(self.sig_e, self.sig_h, self.weight)
            count_grad, count_curv = self.count_terms(self.theta)
            _, seen_grad, seen_info = self.seen_terms(self.theta)
            hess = jwj + np.diag(self.prec) + count_curv + seen_info
            grad = jwr - self.prec * (self.theta - self.mu) + count_grad + seen_grad
            step = np.linalg.solve(hess + damping * np.diag(np.diag(hess)), grad)
            cand = self.theta + step
            cand_post = self.posterior(cand)
            cand_obj = self.objective(cand, cand_post)
            if cand_obj <= obj:
                converged = (obj - cand_obj < 1e-8 * max(1.0, abs(obj))
                             or float(np.abs(step).max()) < 1e-6)
                self.theta, post, obj = cand, cand_post, cand_obj
                damping = max(damping / 3.0, 1e-7)
                if converged:
                    return
            else:
                damping *= 4.0
                if damping > 1e6:
                    return

    def fit_spreads(self) -> None:
        """Noise and host spreads by the Laplace marginal likelihood (which charges for
        the parameters the fit spends), under log-normal priors."""
        post = self.posterior(self.theta)
        prior_e, prior_h = math.log(self.p.noise_sd), math.log(self.p.host_sd)
        s2 = self.p.spread_log_sd**2
        fixed = np.diag(self.prec) + self.count_terms(self.theta)[1] + self.seen_terms(
            self.theta)[2]

        def log_evidence(le: float, lh: float) -> float:
            rwr, logdet, jwj, _, _ = post.parts(math.exp(le), math.exp(lh), self.weight)
            sign, logdet_h = np.linalg.slogdet(jwj + fixed)
            if sign <= 0:
                return -math.inf
            return float(-0.5 * (rwr + logdet + logdet_h)
                         - 0.5 * ((le - prior_e) ** 2 + (lh - prior_h) ** 2) / s2)

        le, lh = math.log(self.sig_e), math.log(self.sig_h)
        for _ in range(2):
            le = _golden(partial(log_evidence, lh=lh), math.log(0.005), math.log(1.0))
            lh = _golden(partial(log_evidence, le), math.log(0.005), math.log(1.5))
        self.sig_e, self.sig_h = math.exp(le), math.exp(lh)

    def log_evidence(self) -> float:
        """The log marginal likelihood at the fit (Laplace in the parameters, the host
        effects integrated out; the partition counts by the lower bound EM maximises:
        their expected log prior and likelihood plus their posterior's entropy), up to
        a constant every RAM form shares (both forms have the same parameters; the one a
        form leaves unused keeps its prior, whose precision cancels)."""
        theta = self.theta
        post = self.posterior(theta)
        rwr, logdet, jwj, _, _ = post.parts(self.sig_e, self.sig_h, self.weight)
        seen_loglik, _, seen_info = self.seen_terms(theta)
        _, logdet_h = np.linalg.slogdet(jwj + np.diag(self.prec) + self.count_terms(theta)[1]
                                        + seen_info)
        r = self.resp
        entropy = -float(np.where(r > 0, r * np.log(np.maximum(r, 1e-300)), 0.0).sum())
        s2 = self.p.spread_log_sd**2
        spreads = ((math.log(self.sig_e / self.p.noise_sd)) ** 2
                   + (math.log(self.sig_h / self.p.host_sd)) ** 2) / s2
        return float(-0.5 * (rwr + logdet + logdet_h + spreads)
                     - 0.5 * float((self.prec * (theta - self.mu) ** 2).sum())
                     + self.count_log_prior(theta) + entropy + seen_loglik)

    def update_weights(self) -> None:
        """EM's E-step for the host tails: each machine's weight from its host effect's
        posterior."""
        post = self.posterior(self.theta)
        _, _, _, _, c = post.parts(self.sig_e, self.sig_h, self.weight)
        effect = c * post.qrm / self.sig_e**2
        nu = self.p.host_tail_dof
        self.weight = (nu + 1.0) / (nu + (effect**2 + c) / self.sig_h**2)

    def update_counts(self) -> None:
        """EM's E-step for the partition counts: each slice's posterior over the counts
        it might hold, from the prior's step and how well each count explains its
        machine's runs (the host effect integrated out; the machine's other slices at
        their current counts)."""
        prior = self.count_weights(self.theta)
        current = self.row_log_count()
        f_now = _evaluate(self.theta, self.d, self.p, self.n_gpu, self.n_fam, jacobian=False,
                          log_count=current).f
        wanted = prior[self.unit_of_row] > 0
        if (prior > 0).sum(axis=1).max() <= 1:
            self.resp = prior
            return
        f_counts = _count_rates(self.theta, self.d, self.p, self.n_gpu, self.n_fam, wanted)
        q, resid = self.data.q, self.data.y - f_now
        e2, h2 = self.sig_e**2, self.sig_h**2 / self.weight
        starts = self.data.starts
        qm = np.add.reduceat(q, starts)
        c_m = h2 / (1.0 + h2 * qm / e2)
        s_m = np.add.reduceat(q * resid, starts)
        q_m = np.add.reduceat(q * resid * resid, starts)
        delta = np.where(wanted, f_now[:, None] - f_counts, 0.0)  # resid + delta at count c
        ds = np.add.reduceat(q[:, None] * delta, self.data.unit_starts, axis=0)
        dq = np.add.reduceat(q[:, None] * (2.0 * resid[:, None] * delta + delta * delta),
                             self.data.unit_starts, axis=0)
        machine_of_unit = np.searchsorted(starts, self.data.unit_starts, side="right") - 1
        m = machine_of_unit
        loglik = -0.5 * ((q_m[m, None] + dq) / e2 - c_m[m, None] * ((s_m[m, None] + ds) / e2) ** 2)
        logits = np.where(prior > 0, np.log(np.maximum(prior, 1e-300)) + loglik, -np.inf)
        logits -= logits.max(axis=1, keepdims=True)
        resp = np.exp(logits)
        self.resp = resp / resp.sum(axis=1, keepdims=True)
