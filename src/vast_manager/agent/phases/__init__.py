"""The agent's phases, one class each, built on the shared ``context.AgentContext`` and
given the phases they use: reporting (hello, heartbeats, logs, results), fetch, warmup
(the daemon's start and warm-up), proving, benchmark (and the scaling run), ending;
``shared`` holds the seams and constants. ``vast_manager.agent.lifecycle.Agent`` runs
them in its loop and obeys the ``context.Orders``."""
