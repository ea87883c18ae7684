"""GMF-style matrix factorization under Flower's SecAgg+, with a malicious-server plan."""
