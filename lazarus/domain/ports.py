"""The one way Lazarus picks a free TCP port: the launcher's rendezvous port on a
single node, the dev server, the benches and the tests all ask here.

Standard library only (a training script run without a launcher picks its
``MASTER_PORT`` here too). The only system call on the domain floor: a bind and
a close, with nothing kept.
"""

from __future__ import annotations

import socket


def free_port(host: str = "127.0.0.1") -> int:
    """A port that was free on ``host`` a moment ago. Another process may take it
    before the caller binds: callers that cannot retry must hold the socket instead."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        port: int = probe.getsockname()[1]
        return port
