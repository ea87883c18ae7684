"""Plain federated MF with ridge user vectors (privaudit test app)."""
