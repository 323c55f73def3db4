"""Pure decisions: instance states, lifecycle policy, plausibility, early verdicts, ranking,
reconciliation and the instance share of a host. No I/O, no clock reads."""
