"""Seeded example-snapshot generator: real DCGM scrapes and EKS node objects → snapshot directories (docs/architecture.md §5).

Everything is derived from the copies in ``tests/fixtures/sources`` (see its ``PROVENANCE.md``); nothing is
read from outside the repository, so a user's clone can regenerate the committed demo byte for byte (a
developer tool: it is not part of the installed package)::

    python -m tests.support.examplegen --out DIR [--nodes N] [--seed S] [--scenario demo|scale]

Output (the snapshot directory contract of docs/architecture.md §5, plus two files for people and tests):

- ``snapshot.json`` ``{"taken_at", "window_seconds", "step_seconds", "cluster", "region"}``.
- ``nodes.json``, ``pods.json``, ``pdbs.json``: ``kubectl get -o json`` lists (``kind: List``).
- ``nodegroups.json``: EKS DescribeNodegroup ``.nodegroup`` objects, DescribeAutoScalingGroups groups and the
  DescribeAutoScalingInstances answer for every node's instance (an instance missing there is standalone).
- ``instances.json``: EC2 DescribeInstances ``{"Reservations": [...]}``.
- ``metrics/<METRIC>.json``: Prometheus ``/api/v1/query_range`` matrix responses over
  [taken_at − window, taken_at] at ``step_seconds`` (W/step + 1 points, both ends, like Prometheus 2.x),
  ``metrics/DCGM_FI_DEV_GPU_UTIL.timestamp.json`` (``timestamp()`` of the raw samples, 15 s scrapes).
- ``expected.json`` ``{"<node>": {"verdict", "reasons_include": [code, ...]}}`` and ``PROVENANCE.md``: what
  each node is meant to show under the default policy, and why (docs/architecture.md §3).

Determinism: only ``random.Random(seed)`` is used, every JSON file is written with sorted keys, so the same
arguments give byte-identical files.
"""

from tests.support.examplegen.generate import generate_snapshot, main
from tests.support.examplegen.sources import (
    DCGM_METRICS,
    DEFAULT_TAKEN_AT,
    INSTANCE_TYPES,
    METRIC_FILES,
    SCENARIOS,
    sources_dir,
)

__all__ = [
    "DCGM_METRICS",
    "DEFAULT_TAKEN_AT",
    "INSTANCE_TYPES",
    "METRIC_FILES",
    "SCENARIOS",
    "generate_snapshot",
    "main",
    "sources_dir",
]
