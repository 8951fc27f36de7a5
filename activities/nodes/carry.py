"""``python -m activities.nodes.carry``: carry a node's surviving ranks into the next
generation, run on that node (``rejoin`` on ssh nodes).

The shim's ``rejoin`` runs it with the ranks' own interpreter, as warm starts run
:mod:`activities.nodes.warm`: a :class:`~activities.nodes.node_records.CarryRequest` on
stdin (it holds rank variables: stdin only, never argv), one
:class:`~activities.nodes.node_records.CarryResult` JSON line on stdout, or
``{"error": ...}``. The work is the local agent's own
(:func:`activities.nodes.fencing.carry_here`), so every node carries alike."""

from __future__ import annotations

import json
import sys

from pydantic import ValidationError

from activities.nodes.fencing import carry_here
from activities.nodes.node_records import CarryRequest


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
    return 0


if __name__ == "__main__":
    sys.exit(main())
