"""Curio's facts both sides use: its worker port and the variables that name a node."""

from __future__ import annotations

#: Curio's worker API port: ``curio run --listen`` defaults to ``0.0.0.0:12300`` and reads
#: ``CURIO_LISTEN`` (cmd/curio/run.go in filecoin-project/curio at e0294b0f).
CURIO_PORT = 12300
CURIO_LISTEN = "CURIO_LISTEN"
#: ``curio run --name`` reads it, and Curio writes it to ``harmony_machine_details.machine_name``
#: (cmd/curio/run.go; cmd/curio/tasks/tasks.go ``machineDetails``).
CURIO_NODE_NAME = "CURIO_NODE_NAME"
