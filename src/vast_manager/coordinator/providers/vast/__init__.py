"""The vast.ai provider: the REST client, the Provider on it, and offer filter strings."""
