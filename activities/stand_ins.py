"""Activities that stand in for the real ones, built from the activity references.

The workflow tests run the real ``JobWorkflow`` against a scripted fake cluster
(``tests/workflow/fakes.py``) and the simulator against a simulated one
(:mod:`workers.simulate.cluster`). Both must register exactly the names and the types the
workflow calls (:mod:`lazarus.domain.activity_refs`). Written out by hand, each
fake repeated that roster and could drift from it: a renamed activity, or a request
decoded with other types than the real activity's, would pass the fakes and fail a
real worker. Here the roster is read once from the references: a stand-in is an
implementation's method named as the reference, registered under the reference's
name and decoded with the reference's request and result types.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from temporalio import activity

from lazarus.domain.activity_refs import ALL, ActivityRef
from lazarus.domain.contracts import LaunchRequest, LaunchResult

StandIn = Callable[[Any], Awaitable[Any]]
"""One activity: a request in, a result out."""


def stand_ins(impl: object, refs: Iterable[ActivityRef[Any, Any]] = ALL) -> list[StandIn]:
    """One activity per reference in ``refs`` (default: every one the controller
    registers), each calling ``impl``'s attribute of the reference's name: a method
    of a fake cluster, or a module's function. Raises AttributeError, naming the
    activity, when ``impl`` has none: a fake that misses one is found at start,
    not when the workflow first calls it."""
    built = []
    for ref in refs:
        method = getattr(impl, ref.name, None)
        if method is None:
            raise AttributeError(f"{impl!r} has no {ref.name!r}: it stands in for every activity")
        built.append(_stand_in(ref, method))
    return built


def _stand_in(ref: ActivityRef[Any, Any], method: StandIn) -> StandIn:
    async def call(request: Any) -> Any:
        return await method(request)

    call.__name__ = call.__qualname__ = ref.name
    call.__doc__ = method.__doc__
    # Temporal decodes the request and encodes the result by these hints: the
    # reference's, as for the real activity, whatever ``method`` says of itself.
    call.__annotations__ = {"request": ref.request_type, "return": ref.result_type}
    return activity.defn(name=ref.name)(call)


def launched_without_ranks(
    request: LaunchRequest, at: float, master_addr: str, **fields: Any
) -> LaunchResult:
    """A stand-in's launch of ``request``'s generation at ``at`` (wall clock): a
    fake cluster starts no processes, so there are no ranks and nothing adopted;
    ``fields`` are what a fake decides beyond that (warm starts, rejoins)."""
    return LaunchResult(
        generation=request.generation,
        master_addr=master_addr,
        master_port=29500,
        run_dir=f"{request.run_root}/gen-{request.generation:05d}",
        ranks=[],
        launched_at=at,
        adopted=False,
        ranks_started_at=at,
        **fields,
    )
