"""What changes the fleet: agent messages written (hello, heartbeat, result, logs: one
module each), the operator's commands, deploys, and the monitor loop."""
