"""What both sides run that is not the wire contract: the settings tables' bounds rule
and the one retry policy (docs/architecture.md)."""
