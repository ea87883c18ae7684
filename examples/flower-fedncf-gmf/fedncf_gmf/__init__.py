"""FedNCF with the GMF model (implicit feedback, MF-FedAvg over item rows): a Flower reference app."""
