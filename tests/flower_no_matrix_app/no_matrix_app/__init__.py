"""A NumPy-template-like Flower app: a 10 x 3 linear model trained with FedAvg."""
