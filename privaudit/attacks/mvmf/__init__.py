"""MVMF attacks (FedMVMF, PrivMVMF): the server decodes ratings and attributes from item gradients."""
