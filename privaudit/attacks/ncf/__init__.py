"""FedNCF attacks: honest-but-curious interaction inference and the malicious server's crafts."""
