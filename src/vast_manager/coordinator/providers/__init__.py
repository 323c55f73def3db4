"""Where instances come from: vast.ai (REST) or the local simulated fleet."""
