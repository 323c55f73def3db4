"""``python -m vast_manager.coordinator.cli``: the ``vast-manager`` command."""

from vast_manager.coordinator.cli.commands import main

main()
