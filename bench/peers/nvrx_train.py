"""The example job under NVRx's ``ft_launcher``: the same script, plus NVRx heartbeats.

``ft_launcher`` declares a rank hung when its heartbeats stop, so the one change the
example needs is to send them, with NVRx's documented client: this wraps the example's
per-step ``lazarus.rank.heartbeat`` (a no-op outside Lazarus) so that every step also
beats for NVRx, then runs the example's own ``main``; training, checkpoints and resume
are the example's.
"""

from __future__ import annotations

import sys
from pathlib import Path

# examples/ is no package: the example is imported as ``train_ddp`` from there.
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import train_ddp

import lazarus.rank as lazarus_rank


def main() -> int:
    from nvidia_resiliency_ext.fault_tolerance import RankMonitorClient

    client = RankMonitorClient()
    client.init_workload_monitoring()
    beat = lazarus_rank.heartbeat

    def heartbeat(step: int, **fields: float) -> None:
        client.send_heartbeat()
        beat(step, **fields)

    lazarus_rank.heartbeat = heartbeat
    try:
        return int(train_ddp.main(sys.argv[1:]))
    finally:
        client.shutdown_workload_monitoring()


if __name__ == "__main__":
    sys.exit(main())
