"""Federated GMF on implicit feedback (privaudit test app)."""
