"""``python -m activities.nodes.warm``: start a node's ranks warm, run on that node (the
shim's ``warm`` on ssh and Slurm nodes).

A :class:`~activities.nodes.node_records.NodeWarmRequest` on stdin (it holds the
ranks' environments: stdin only, never argv), one
:class:`~activities.nodes.warm_starts.WarmAnswer` JSON line per rank on stdout, or
``{"error": ...}``. The work is :func:`activities.nodes.warm_starts.answer_request`,
the code the local agent runs in the worker.

Where the run's zygote already serves on the node (every launch after the run's
first there, and a prewarmed spare's), the request runs in a fork of it, which has
the warm starts' code imported (:data:`ZYGOTE_PRELOAD`): this process imports only
the standard library and copies the answer lines back
(:mod:`activities.nodes.zygote_socket`). Otherwise, as on the run's first launch,
which starts the zygote, it runs here. Standard library only at import, for that."""

from __future__ import annotations

import sys
from typing import BinaryIO

from activities.nodes.zygote_socket import relayed_main

ZYGOTE_PRELOAD = ("activities.nodes.warm_starts",)
"""What :func:`run` imports, imported by the zygote that runs it (its ``VERBS``)."""


def run(stdin: bytes, out: BinaryIO) -> int:
    from activities.nodes.warm_starts import answer_request

    return answer_request(stdin, out)


def main() -> int:
    return relayed_main("warm", run)


if __name__ == "__main__":
    sys.exit(main())
