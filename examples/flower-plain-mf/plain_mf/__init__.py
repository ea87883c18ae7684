"""Federated matrix factorization with Flower's stock FedAvg over the whole item matrix."""
