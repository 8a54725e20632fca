"""GPU Rightsizer: find idle and oversized GPU nodes on EKS from DCGM metrics, drain them safely, scale in.

Layers (enforced by import-linter): ``rightsizer.domain`` is pure (no I/O, no clock, no SDKs);
``rightsizer.services`` are use cases over the ports in ``rightsizer.ports``; ``rightsizer.adapters`` talk
to Prometheus, Kubernetes and AWS; ``rightsizer.cli`` and the Lambda handlers wire them together.
"""

__version__ = "0.1.0"
