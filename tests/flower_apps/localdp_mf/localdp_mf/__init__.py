"""Federated MF with Flower's stock FedAvg and LocalDpMod (privaudit test app)."""
