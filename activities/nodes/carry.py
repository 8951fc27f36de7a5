"""``python -m activities.nodes.carry``: carry a node's surviving ranks into the next
generation, run on that node (``rejoin`` on ssh nodes).

The shim's ``rejoin`` runs it with the ranks' own interpreter, as warm starts run
:mod:`activities.nodes.warm`: a :class:`~activities.nodes.node_records.CarryRequest` on
stdin (it holds rank variables: stdin only, never argv), one
:class:`~activities.nodes.node_records.CarryResult` JSON line on stdout, or
``{"error": ...}``. The work is the local agent's own
(:func:`activities.nodes.fencing.carry_here`), so every node carries alike.

With ``CarryRequest.start`` it then starts the node's other ranks warm in the same
process, one :class:`~activities.nodes.warm.WarmAnswer` line each after the carry's:
the replacement of a crashed rank is forked one interpreter start and one round trip
sooner than by a second call (``NodeAgent.carry_and_start``)."""

from __future__ import annotations

import json
import sys

from pydantic import ValidationError

from activities.nodes.fencing import carry_here
from activities.nodes.node_records import CarryRequest
from activities.nodes.warm import answer_start


def main() -> int:
    """A bad request names its fields, never their values (a value may be a secret)."""
    try:
        request = CarryRequest.model_validate_json(sys.stdin.buffer.read())
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(map(str, e['loc'])) or 'request'}: {e['msg']}" for e in exc.errors()
        )
        print(json.dumps({"error": f"rejoin: bad request on stdin: {problems}"}), flush=True)
        return 2
    try:
        result = carry_here(request)
    except (OSError, ValueError) as exc:
        print(json.dumps({"error": f"rejoin: {exc}"}), flush=True)
        return 1
    print(result.model_dump_json(), flush=True)
    if request.start is not None and not result.unkillable:
        # Never beside a group that would not die: the launcher refuses the launch.
        carried = {r.rank for r in result.carried}
        rest = [r for r in request.start.ranks if r.rank not in carried]
        if rest:
            for answer in answer_start(request.start.model_copy(update={"ranks": rest})):
                print(answer.model_dump_json(), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
