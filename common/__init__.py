"""What both sides run that is not the wire contract: the settings tables' bounds rule
(docs/architecture.md)."""
