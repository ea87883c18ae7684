"""Recorders of real federated runs (Flower) and the schema maps that name their messages."""
