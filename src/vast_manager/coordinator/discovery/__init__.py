"""Discovery: predict any offer's rate from its hardware, and plan which machines to try next.

Pure functions and dataclasses, no I/O and no clock (time is passed in):

- ``features``: an offer (vast.ai field names) as the hardware facts the model reads,
  with the instance's share of the host's vCPUs and RAM;
- ``measurements``: a measured rate with the offer it ran on (``hosts import`` lines);
- ``model``: ``fit_rate_model(measurements) -> RateModel``; ``RateModel.predict(offer)``
  gives a rate, an 80% interval and the features that moved it;
- ``served``: ``fit_served_model(measurements) -> ServedModel``: the rate model and two
  tree-ensemble learners, picked or blended by cross-validation grouped by machine,
  with conformal intervals (what the coordinator serves);
- ``plan``: ``plan_trials(offers, model, fleet, settings) -> Plan``: which offers to
  benchmark next, each with its expected value against its trial's cost and the
  hypothesis it tests;
- ``autopilot``: ``decide(instances, plan, caps, ledger, now=...) -> Decision``: the
  actions that keep a fleet at its target rate for the least per proof, within caps.

docs/discovery.md explains the model, the plan and the figures of bench/discovery.py.
"""

from vast_manager.coordinator.discovery.autopilot_rules import (
    Action,
    AutopilotCaps,
    Decision,
    FleetInstance,
    Ledger,
    clearing_usd_per_proof,
    decide,
    plan_reference_usd_per_proof,
)
from vast_manager.coordinator.discovery.features import FeatureError, OfferFeatures, offer_features
from vast_manager.coordinator.discovery.measurements import (
    Measurement,
    MeasurementError,
    parse_measurement,
)
from vast_manager.coordinator.discovery.plan import (
    FleetView,
    MeasuredOffer,
    Plan,
    PlanSettings,
    Proposal,
    TrialCost,
    plan_trials,
)
from vast_manager.coordinator.discovery.served import (
    CandidateScore,
    ServedModel,
    fit_served_model,
)
from vast_manager.coordinator.discovery.structural_model import (
    Contribution,
    Prediction,
    Priors,
    RateModel,
    Unpredictable,
    fit_rate_model,
)

__all__ = [
    "Action",
    "AutopilotCaps",
    "CandidateScore",
    "Contribution",
    "Decision",
    "FeatureError",
    "FleetInstance",
    "FleetView",
    "Ledger",
    "MeasuredOffer",
    "Measurement",
    "MeasurementError",
    "OfferFeatures",
    "Plan",
    "PlanSettings",
    "Prediction",
    "Priors",
    "Proposal",
    "RateModel",
    "ServedModel",
    "TrialCost",
    "Unpredictable",
    "clearing_usd_per_proof",
    "decide",
    "fit_rate_model",
    "fit_served_model",
    "offer_features",
    "parse_measurement",
    "plan_reference_usd_per_proof",
    "plan_trials",
]
