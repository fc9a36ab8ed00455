"""The reliability tier: faults injected on purpose, hostile input, resource limits, load."""
