"""Adapters: the only code that talks to AWS, Kubernetes and Prometheus; SDK errors end here."""
