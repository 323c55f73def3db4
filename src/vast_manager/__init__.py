"""vast-manager: a fleet of rented vast.ai GPU machines proving Filecoin with CuZK.

Everything installs under this one name: ``vast_manager.agent`` (runs on each
instance), ``vast_manager.coordinator`` (the server, the store and the operator's
CLI), ``vast_manager.protocol`` (the wire contract both import) and
``vast_manager.common`` (what both sides run that is not the wire contract). They live
at the top of the repository; ``vast_manager/`` links to them (docs/architecture.md).
"""
