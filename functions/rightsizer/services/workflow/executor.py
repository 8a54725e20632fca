"""One executor for every workflow kind (issue 25; Karpenter's one queue that executes any command).

A workflow kind (``rightsizer.services.drain``'s scale-in, ``consolidate``, ``resize``, ``replace`` and its
child drain) is one module with its own facts model (``rightsizer.domain.workflow_details``), its own
request type, its explicit step table and its rollback. Kinds do not inherit from each other: what they
share are the drain's steps (:mod:`rightsizer.services.workflow.drain_steps`), composed, not overridden.

The executor holds the kinds a deployment runs and, for an execution id, loads the record, takes the
record's kind from the table of kinds (the facts model's ``kind``) and runs its step table through
:func:`rightsizer.services.workflow.engine.run_step`. It is what the Lambda task contract
(``rightsizer.handler_io.run_drain_task``) and the in-process runner call.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Protocol

from rightsizer.domain.errors import PermanentError
from rightsizer.services.workflow.engine import StepFn, StepResult, run_step
from rightsizer.services.workflow.requests import DrainDeps, DrainRequest
from rightsizer.state import WorkflowRecord


class Kind(Protocol):
    """A workflow kind: what the executor needs of it."""

    @property
    def name(self) -> str:
        """The ``kind`` of its records' details."""
        ...

    @property
    def request_type(self) -> type[DrainRequest]:
        """The request type that starts it (a subclass of :class:`DrainRequest` names its own kind)."""
        ...

    def start(self, request: DrainRequest) -> WorkflowRecord:
        """Create the record of ``request`` (idempotent: an existing record is returned)."""
        ...

    def steps(self) -> Mapping[str, StepFn]:
        """The kind's explicit step table: step name → step function."""
        ...

    def rollback(
        self, execution_id: str, reason: str, *, status: str = "rolled_back", step: str = "rollback"
    ) -> StepResult:
        """Undo what the workflow did, record ``reason``, end with ``status``."""
        ...

    def request_approval(self, execution_id: str, task_token: str | None) -> StepResult:
        """Open and publish the approval request of a record waiting in step ``approval``."""
        ...


class Executor:
    """Runs the workflows of the kinds it was given, for one cluster (``deps``).

    Args:
        deps: what every kind talks to (cluster, scaler, assessor, state, policy, dry run, clock).
        kinds: the kinds this executor runs; a record or a request of another kind is refused.
    """

    def __init__(self, deps: DrainDeps, kinds: Iterable[Kind]) -> None:
        self.deps = deps
        self._kinds = {kind.name: kind for kind in kinds}
        self._starts = {kind.request_type: kind for kind in self._kinds.values()}

    def _kind_of(self, record: WorkflowRecord) -> Kind:
        kind = self._kinds.get(record.details.kind)
        if kind is None:
            raise PermanentError(f"no_workflow_for_kind:{record.details.kind}")
        return kind

    def _load(self, execution_id: str) -> WorkflowRecord:
        record = self.deps.state.load(execution_id)
        if record is None:
            raise KeyError(execution_id)
        return record

    def start(self, request: DrainRequest) -> WorkflowRecord:
        """Create the workflow record of ``request`` by the kind its type names (idempotent).

        Raises:
            ValueError: no kind of this executor starts requests of that type.
        """
        for cls in type(request).__mro__:
            kind = self._starts.get(cls)
            if kind is not None:
                return kind.start(request)
        raise ValueError(f"no workflow kind starts a {type(request).__name__}")

    def steps(self, kind: str) -> Mapping[str, StepFn]:
        """The step table of workflow kind ``kind``.

        Raises:
            KeyError: this executor runs no such kind.
        """
        return self._kinds[kind].steps()

    def step(self, execution_id: str) -> StepResult:
        """Run the record's current step once and persist its outcome.

        Raises:
            KeyError: no workflow record for ``execution_id``.
            PermanentError: the record is of a kind this executor does not run.
            TransientError: the step should be retried later (the record is unchanged).
        """
        record = self._load(execution_id)
        kind = self._kind_of(record)
        return replace(run_step(record, kind.steps(), kind.rollback), kind=kind.name)

    def rollback(
        self, execution_id: str, reason: str, *, status: str = "rolled_back", step: str = "rollback"
    ) -> StepResult:
        """The record's kind's rollback (the state machine's Catch, the runner's retries spent).

        Raises:
            KeyError: no workflow record for ``execution_id``.
        """
        kind = self._kind_of(self._load(execution_id))
        return replace(kind.rollback(execution_id, reason, status=status, step=step), kind=kind.name)

    def request_approval(self, execution_id: str, task_token: str | None) -> StepResult:
        """Open and publish the approval request of a workflow waiting in step ``approval`` (idempotent).

        Raises:
            KeyError: no workflow record for ``execution_id``.
        """
        return self._kind_of(self._load(execution_id)).request_approval(execution_id, task_token)
