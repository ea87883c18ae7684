"""Federated matrix factorization with FedAvg over item rows (a Flower reference app)."""
