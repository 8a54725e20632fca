"""What a standalone GPU instance's resize touches, for tests: the node's kubelet and an in-memory EC2.

``Kubelet.sync`` plays the kubelet and the cloud node lifecycle controller for one Node: while its instance
is stopped the Node is NotReady; once it runs, the kubelet re-registers it with the instance's type (label
``node.kubernetes.io/instance-type``) and that type's GPUs (catalog ``gpu_count``) as capacity and
allocatable — unless the type is listed in ``broken_types`` (say, an AMI without the new GPU's driver), in
which case no GPU becomes allocatable. The Node object is kept, with its annotations and cordon.

``FakeInstances`` is an ``InstanceTypeChanger`` over one instance in memory with EC2's transitions
(running → stopping → stopped → pending → running, one ``describe`` per transition).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from rightsizer.adapters.aws_errors import ActionRefusedError
from rightsizer.domain.catalog import load_catalog
from rightsizer.ports import InstanceFacts

GPU = "nvidia.com/gpu"


class NodeStore(Protocol):
    def get_node(self, name: str) -> dict[str, Any] | None: ...

    def add_node(self, obj: dict[str, Any]) -> dict[str, Any]: ...


class Kubelet:
    """Keeps Node ``name`` in line with its instance (``describe() -> (state, instance_type)``)."""

    def __init__(
        self,
        nodes: NodeStore,
        name: str,
        describe: Callable[[], tuple[str, str]],
        *,
        broken_types: frozenset[str] = frozenset(),
    ) -> None:
        self.nodes = nodes
        self.name = name
        self.describe = describe
        self.broken_types = broken_types
        self.registrations: list[str] = []

    def sync(self) -> None:
        node = self.nodes.get_node(self.name)
        if node is None:
            return
        state, instance_type = self.describe()
        updated = copy.deepcopy(node)
        conditions = [c for c in updated["status"].get("conditions", []) if c.get("type") != "Ready"]
        running = state == "running"
        conditions.append(
            {"type": "Ready", "status": "True" if running else "Unknown", "reason": "KubeletReady" if running
             else "NodeStatusUnknown"}
        )  # fmt: skip
        updated["status"]["conditions"] = conditions
        if running:
            labels = updated["metadata"].setdefault("labels", {})
            if labels.get("node.kubernetes.io/instance-type") != instance_type:
                self.registrations.append(instance_type)
            labels["node.kubernetes.io/instance-type"] = instance_type
            labels["beta.kubernetes.io/instance-type"] = instance_type
            row = load_catalog().get(instance_type)
            gpus = 0 if instance_type in self.broken_types or row is None else row.gpu_count
            updated["status"].setdefault("capacity", {})[GPU] = str(gpus)
            updated["status"].setdefault("allocatable", {})[GPU] = str(gpus)
        # Write only a change (a kubelet patches status, it never rewrites what others set meanwhile).
        if updated != node:
            updated["metadata"].pop("resourceVersion", None)
            self.nodes.add_node(updated)


@dataclass
class FakeInstances:
    """``InstanceTypeChanger`` of one in-memory instance; ``start_errors`` maps a type to the error its
    next start raises (once), ``refuse`` lists target types the preflight refuses."""

    instance_id: str
    instance_type: str
    tags: dict[str, str]
    state: str = "running"
    start_errors: dict[str, Exception] = field(default_factory=dict)
    refuse: frozenset[str] = frozenset()
    on_change: Callable[[], None] = lambda: None
    calls: list[str] = field(default_factory=list)

    def describe(self, instance_id: str) -> InstanceFacts:
        assert instance_id == self.instance_id
        if self.state in ("stopping", "pending"):
            self.state = "stopped" if self.state == "stopping" else "running"
            self.on_change()
        return InstanceFacts(self.state, self.instance_type, dict(self.tags), "")

    def preflight(self, instance_id: str, target_type: str, *, allow_instance_store_loss: bool) -> None:
        self.calls.append(f"preflight {target_type}")
        if target_type in self.refuse:
            raise ActionRefusedError(f"refusing {target_type}", reasons=["architecture_mismatch"])

    def stop(self, instance_id: str) -> None:
        self.calls.append("stop")
        if self.state in ("running", "pending"):
            self.state = "stopping"
            self.on_change()

    def set_type(self, instance_id: str, instance_type: str) -> None:
        assert self.state == "stopped", f"ModifyInstanceAttribute on a {self.state} instance"
        self.calls.append(f"set_type {instance_type}")
        self.instance_type = instance_type

    def start(self, instance_id: str) -> None:
        self.calls.append(f"start {self.instance_type}")
        error = self.start_errors.pop(self.instance_type, None)
        if error is not None:
            raise error
        if self.state == "stopped":
            self.state = "pending"
