"""What changes the fleet: agent messages written (ingest), deploys, and the monitor loop."""
