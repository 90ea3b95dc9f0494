"""An enqueue call of the SDK as it goes over the wire: its tasks encoded once, sent alone
(`enqueue` through the single endpoint, `enqueue_many` through the batch one) or joined with
other threads' calls into one batch (`taskforge_client.batching`)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from taskforge_client.http import encode
from taskforge_client.models import TaskSpec
from taskforge_client.tracing import current_context


def traced(spec: TaskSpec) -> TaskSpec:
    """`spec` with the current span's context (in the calling thread), unless it has its own:
    each task of a coalesced or batched request keeps its own trace."""
    if spec.traceparent is not None:
        return spec
    context = current_context()
    if "traceparent" not in context:
        return spec
    return replace(spec, traceparent=context["traceparent"], tracestate=context.get("tracestate"))


@dataclass(frozen=True)
class Enqueues:
    """One call's tasks, encoded once: an `enqueue` (one task) or an `enqueue_many`.

    `encoded` holds the task bodies as JSON separated by commas, so that calls join
    into one batch body without encoding anything again.
    """

    encoded: bytes
    count: int
    keyed: bool  # every task has an idempotency key: the call repeats safely
    many: bool  # an enqueue_many: answered with a list, its fields named tasks[i]...
    # An enqueue sent alone goes to the single endpoint, whose body has no trace
    # fields: its body without them, and its trace context as headers.
    alone: bytes = b""
    trace: dict[str, str] = field(default_factory=dict)

    @classmethod
    def one(cls, spec: TaskSpec) -> Enqueues:
        """Made in the caller's thread: the task carries the caller's trace context.

        Raises: ValueError for a spec the API would refuse (`TaskSpec.body`).
        """
        body = traced(spec).body()
        keyed = spec.idempotency_key is not None
        trace: dict[str, str] = {k: body.pop(k) for k in ("traceparent", "tracestate") if k in body}
        alone = encode(body)
        encoded = encode({**body, **trace}) if trace else alone
        return cls(encoded, 1, keyed, many=False, alone=alone, trace=trace)

    @classmethod
    def of(cls, specs: list[TaskSpec]) -> Enqueues:
        encoded = b",".join(encode(traced(spec).body()) for spec in specs)
        keyed = all(spec.idempotency_key is not None for spec in specs)
        return cls(encoded, len(specs), keyed, many=True)

    @classmethod
    def joined(cls, calls: Iterable[Enqueues]) -> Enqueues:
        calls = list(calls)
        encoded = b",".join(call.encoded for call in calls)
        count = sum(call.count for call in calls)
        return cls(encoded, count, all(call.keyed for call in calls), many=True)

    def wire(self) -> tuple[str, bytes, dict[str, str]]:
        """The request as this call makes it on its own: the path after the queue's,
        the body, the headers."""
        if self.many:
            return "/tasks/batch", b'{"tasks":[' + self.encoded + b"]}", {}
        return "/tasks", self.alone, self.trace
