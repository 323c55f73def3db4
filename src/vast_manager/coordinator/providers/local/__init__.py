"""The local provider: a simulated fleet rented from a local catalog of offers."""
