"""What a trial is worth to a fleet of a fixed number of hosts: the fall in its $/proof.

From nothing proving, the operator's fleet is the best ``size`` hosts on offer by
predicted $/proof, one a machine (``autopilot_rules.fleet_margin_usd_per_proof``). Its
$/proof is its rent over its rate, ``p0 = sum(dph) / sum(rate)``, a rate-weighted mean,
so a newcomer that beats the fleet's last host can still raise it: a big host dearer per
proof than ``p0`` weighs more than the small one it pushes out. The saving a trial can
bring is then the fall of that mean when the newcomers take their places,

    gain per hour = E[ max(0, p0 - p1) ] x the fleet's rate,     p1 = the best ``size`` of
                                                                  the fleet and newcomers

in dollars an hour at the fleet's rate; the plan multiplies it by the hours a kept host
would run, as it does the saving against a reference $/proof. A newcomer's log rate is
normal per mode (the rate model's); several newcomers drawn together move as one (one
common normal draw), which is how a GPU model's unmeasured speed moves all its offers.
The expectation is Gauss-Hermite quadrature over that draw.

Pure: numbers in, numbers out. docs/discovery.md, section 3, gives the reasoning.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

import numpy as np
from numpy.polynomial.hermite_e import hermegauss

#: Quadrature nodes over a standard normal draw (probabilists' Hermite).
NODES, WEIGHTS = hermegauss(20)
WEIGHTS = WEIGHTS / WEIGHTS.sum()


@dataclass(frozen=True, slots=True)
class FleetHost:
    """One host of the fleet on offer, at its predicted (or measured) rate."""

    machine_id: str | None
    dph_total: float
    rate_per_hour: float


@dataclass(frozen=True, slots=True)
class FleetOnOffer:
    """The best hosts on offer by $/proof, best first, more than ``size`` of them (so
    the fleet without a newcomer's own machines is still whole), and the fleet's size.
    Only hosts the verdict keeps (at most its $/proof): a newcomer that joins the fleet
    beats its last host, so it passes the verdict too."""

    hosts: tuple[FleetHost, ...]
    size: int

    def without(self, machines: Collection[str]) -> tuple[FleetHost, ...]:
        """The fleet the operator gets if none of ``machines`` is tried."""
        kept = [h for h in self.hosts if h.machine_id is None or h.machine_id not in machines]
        return tuple(kept[:self.size])

    def relying_on(self, machines: Collection[str]) -> tuple[FleetHost, ...] | None:
        """The fleet's other hosts when it counts on some of ``machines`` untried (one of
        them among its ``size`` best at its prediction), else None."""
        top = self.hosts[:self.size]
        rest = tuple(h for h in top if h.machine_id is None or h.machine_id not in machines)
        return rest if len(rest) < len(top) else None


#: One way the newcomers' rates may go: its probability, their log rates' means and sds.
Draw = tuple[float, Sequence[float], Sequence[float]]


def gain_per_hour(base: Sequence[FleetHost], size: int, dph_total: Sequence[float],
                  draws: Sequence[Draw], *,
                  relying: Sequence[FleetHost] | None = None) -> float:
    """E[max(0, p0 - p1)] x the fleet's rate (dollars an hour): ``p0`` the $/proof of
    ``base``, ``p1`` that of the best ``size`` of ``base`` and the newcomers at
    ``dph_total``, whose log rates follow ``draws`` (within a draw, one common normal).

    With ``relying`` (the fleet's other hosts when it counts on the newcomers untried:
    ``FleetOnOffer.relying_on``) the larger of that and what the trial saves the fleet
    that would rent them untried, E[max(0, pu - p1)], ``pu`` that fleet's $/proof at
    the newcomers' drawn rates: a doubtful host the fleet relies on is worth testing for
    the loss it would bring."""
    if not base or not draws:
        return 0.0
    cost = np.array([h.dph_total for h in base])
    rate = np.array([h.rate_per_hour for h in base])
    p0 = float(cost.sum() / rate.sum())
    new_cost = np.asarray(dph_total, dtype=float)
    all_cost = np.concatenate([cost, new_cost])
    if relying is not None:
        held_cost = sum(h.dph_total for h in relying) + float(new_cost.sum())
        held_rate = sum(h.rate_per_hour for h in relying)
    # Every draw's every node at once: one row a way the newcomers' rates may go.
    prob = (np.array([d[0] for d in draws], dtype=float)[:, None] * WEIGHTS).ravel()
    mu = np.array([d[1] for d in draws], dtype=float)[:, None, :]
    sd = np.array([d[2] for d in draws], dtype=float)[:, None, :]
    drawn = np.exp(mu + sd * NODES[None, :, None]).reshape(prob.shape[0], -1)
    all_rate = np.concatenate([np.broadcast_to(rate, (drawn.shape[0], rate.shape[0])), drawn],
                              axis=1)
    best = np.argsort(all_cost / all_rate, axis=1, kind="stable")[:, :size]
    p1 = all_cost[best].sum(axis=1) / np.take_along_axis(all_rate, best, axis=1).sum(axis=1)
    gain = float(prob @ np.maximum(0.0, p0 - p1))
    if relying is not None:
        pu = held_cost / (held_rate + drawn.sum(axis=1))
        gain = max(gain, float(prob @ np.maximum(0.0, pu - p1)))
    return gain * float(rate.sum())
