"""``python -m activities.nodes.carry``: carry a node's surviving ranks into the next
generation, run on that node (``rejoin`` on ssh and Slurm nodes).

The shim's ``rejoin`` runs it with the ranks' own interpreter, as warm starts run
:mod:`activities.nodes.warm`: a :class:`~activities.nodes.node_records.CarryRequest` on
stdin (it holds rank variables: stdin only, never argv), one
:class:`~activities.nodes.node_records.CarryResult` JSON line on stdout, or
``{"error": ...}``. The work is the local agent's own
(:func:`activities.nodes.fencing.carry_here`), so every node carries alike.

With ``CarryRequest.start`` it then starts the node's other ranks warm in the same
process, one :class:`~activities.nodes.warm_starts.WarmAnswer` line each after the carry's:
the replacement of a crashed rank is forked one interpreter start and one round trip
sooner than by a second call (``NodeAgent.carry_and_start``).

Where the run's zygote serves on the node, the carry runs in a fork of it, which has
this module's imports done (:data:`ZYGOTE_PRELOAD`): this process then imports only
the standard library and copies the answer lines back
(:mod:`activities.nodes.zygote_socket`). A carry is safe to repeat (a carried rank is
adopted, a fenced one stays fenced), so where the zygote runs nothing, it runs here."""

from __future__ import annotations

import sys
from typing import BinaryIO

from activities.nodes.zygote_socket import relayed_main

ZYGOTE_PRELOAD = ("activities.nodes.fencing", "activities.nodes.warm_starts")
"""What :func:`run` imports, imported by the zygote that runs it (its ``VERBS``)."""


def run(stdin: bytes, out: BinaryIO) -> int:
    """Carry (then start) as ``stdin``'s request says, one JSON line each on ``out``.
    A bad request names its fields, never their values (a value may be a secret)."""
    from activities.nodes.fencing import carry_here
    from activities.nodes.node_records import CarryRequest, NodeAnswers
    from activities.nodes.warm_starts import answer_start

    answers = NodeAnswers("rejoin", out)
    request = answers.request(CarryRequest, stdin)
    if request is None:
        return 2
    try:
        result = carry_here(request)
    except (OSError, ValueError) as exc:
        answers.error(str(exc))
        return 1
    answers.say(result.model_dump_json())
    if request.start is not None and not result.unkillable:
        # Never beside a group that would not die: the launcher refuses the launch.
        carried = {r.rank for r in result.carried}
        rest = [r for r in request.start.ranks if r.rank not in carried]
        if rest:
            for answer in answer_start(request.start.model_copy(update={"ranks": rest})):
                answers.say(answer.model_dump_json())
    return 0


def main() -> int:
    return relayed_main("carry", run)


if __name__ == "__main__":
    sys.exit(main())
