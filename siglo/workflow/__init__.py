"""A small durable-workflow runtime on top of the storage manager (SPEC §8).

Steps run in order; each step's output is checkpointed before the next starts, so a run
that crashed resumes after its last finished step. A step may suspend on a durable wait
for an event (:func:`wait_for_event`); the event, delivered in any process with
:meth:`Flow.deliver`, resumes the run there. Steps may be cached in the backend's step
cache. A flow whose steps changed since a checkpoint was written refuses to resume it
(:class:`~siglo.errors.WorkflowVersionMismatchError`) unless a migration is registered.
"""

from siglo.workflow.flow import Flow, WorkflowSuspended, flow
from siglo.workflow.step import (
    Step,
    current_backend,
    current_manager,
    run_input,
    sleep,
    wait_for_event,
)
from siglo.workflow.worker import RetryPolicy, Worker, WorkerPass

__all__ = [
    "Flow",
    "RetryPolicy",
    "Step",
    "Worker",
    "WorkerPass",
    "WorkflowSuspended",
    "current_backend",
    "current_manager",
    "flow",
    "run_input",
    "sleep",
    "wait_for_event",
]
