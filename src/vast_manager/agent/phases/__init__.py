"""The agent's phases, one module each, layered in the order the agent goes through
them: shared (the state) -> reporting -> fetch -> warmup -> proving -> benchmark ->
ending; ``vast_manager.agent.lifecycle.Agent`` runs them in its loop."""
