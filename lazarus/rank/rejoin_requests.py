"""Rejoin requests (issue 16): what the controller asks a rank in its control file
(``{"rejoin": {"generation": N, "env": {"<RANK>": {...}}}}``), how an entry is
checked, and the request read for this rank and not acted on yet. Reading the file
is :mod:`lazarus.rank.control`'s; acting on a request is :mod:`lazarus.rank.rejoin`'s."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from lazarus.domain import environment
from lazarus.rank.identity import _generation_now, _rank_now

REJOIN_POLL_INTERVAL_S = 0.2
"""How often :func:`heartbeat` looks for a rejoin request (one ``stat``): a rank the
controller asks to rejoin leaves within a fraction of a second, and the throttled
path stays a clock read."""

_INTEGER_REJOIN_VARIABLES = frozenset(
    {
        environment.RANK,
        environment.LOCAL_RANK,
        environment.GROUP_RANK,
        environment.WORLD_SIZE,
        environment.LOCAL_WORLD_SIZE,
        environment.ROLE_RANK,
        environment.ROLE_WORLD_SIZE,
        environment.GROUP_WORLD_SIZE,
        environment.MASTER_PORT,
        environment.RESTART_COUNT,
        environment.GENERATION,
        environment.RESUME_STEP,
        environment.MEMORY_KEEP,
        environment.MEMORY_EVERY_STEPS,
        environment.CHECKPOINT_EVERY_STEPS,
    }
)
"""Rejoin variables the helper parses as integers: a request setting one to anything
else is refused whole, rather than crashing the rank after it applied it."""


class RejoinRequested(Exception):
    """The controller asks this rank to leave its generation and rejoin ``generation``
    in place: raised by :func:`heartbeat` and :func:`should_checkpoint`, only under
    :func:`lazarus.rank.torch.run_resilient`, which catches it, tears the process group
    down and rejoins. It reaches a rank that has not noticed the failure itself (a
    rank busy in its own work while a peer died). Let it propagate: a script that
    catches ``Exception`` around its step should re-raise this one."""

    def __init__(self, rank: int, generation: int) -> None:
        super().__init__(f"the controller asks rank {rank} to rejoin generation {generation}")
        self.rank = rank
        self.generation = generation


class GenerationFailed(Exception):
    """A rank of this rank's generation has ended (the supervisor's notice in the
    generation's folder, :data:`lazarus.domain.environment.GENERATION_FAILED_FILE`): raised where
    the step is by :mod:`lazarus.rank.step_interrupt`, only under
    :func:`lazarus.rank.torch.run_resilient`, which tears the process group down and
    waits for its rejoin request, as when a collective fails. Let it propagate, as
    :class:`RejoinRequested`."""


@dataclass(frozen=True)
class RejoinRequest:
    """A valid rejoin request naming this rank: the generation to act for and the
    variables to set (a string) or unset (None); ``LAZARUS_GENERATION`` is always
    among them. Variables the request does not name keep their value."""

    generation: int
    env: dict[str, str | None]


_rejoin_armed = False
"""Set by run_resilient: only then do heartbeat and should_checkpoint look for requests."""
_rejoin_request: RejoinRequest | None = None
"""The newest valid request for this rank read from the control file, not acted on yet."""
_next_rejoin_poll_at = 0.0


def _raise_if_rejoin_requested() -> None:
    if _rejoin_armed and _rejoin_request is not None:
        raise RejoinRequested(_rank_now(), _rejoin_request.generation)


def _parse_rejoin(raw: Any) -> tuple[str | None, RejoinRequest | None]:
    """``(problem, request)``: a request for this rank, or what is wrong with the
    entry; both None for a request that is not for this rank (an older generation,
    or other ranks only: a rank without an entry is one the controller replaces)."""
    if not isinstance(raw, dict):
        return f"{raw!r} is not an object", None
    generation = raw.get("generation")
    if not isinstance(generation, int) or isinstance(generation, bool) or generation < 1:
        return f"generation={generation!r} is not an integer >= 1", None
    entries = raw.get("env")
    if not isinstance(entries, dict):
        return f"env={entries!r} is not an object", None
    if generation <= _generation_now():
        return None, None
    rank = _rank_now()
    entry = entries.get(str(rank))
    if entry is None:
        return None, None
    if not isinstance(entry, dict):
        return f"the entry of rank {rank} is not an object", None
    env: dict[str, str | None] = {}
    for name, value in entry.items():
        if name not in environment.REJOIN_VARIABLES:
            return f"rank {rank}: {name!r} is not a rejoin variable", None
        if value is not None and not isinstance(value, str):
            return f"rank {rank}: {name}={value!r} is neither a string nor null", None
        if value is not None and name in _INTEGER_REJOIN_VARIABLES and not _is_integer(value):
            return f"rank {rank}: {name}={value!r} is not an integer", None
        env[name] = value
    if env.setdefault(environment.GENERATION, str(generation)) != str(generation):
        return (
            f"rank {rank}: {environment.GENERATION}={env[environment.GENERATION]!r} "
            f"contradicts generation {generation}",
            None,
        )
    return None, RejoinRequest(generation, env)


def _is_integer(text: str) -> bool:
    try:
        int(text)
    except ValueError:
        return False
    return True
