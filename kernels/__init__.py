"""Example kernels built by pipeline.yaml; each module groups related @device functions."""
