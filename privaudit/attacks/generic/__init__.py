"""Attacks on recorded federated runs (Flower): they choose themselves by message kinds."""
