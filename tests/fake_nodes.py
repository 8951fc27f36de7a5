"""A scripted node agent and a hand-driven clock, for supervisor tests without processes."""

from __future__ import annotations

from activities.nodes.agent import NodeAgent, NodeStatus, PreflightRequest, PreflightResult
from activities.nodes.node_records import NodeStopResult, RankLaunch, StartedRank
from lazarus.domain.spec import NodeSpec


class FakeClock:
    """The controller's clocks, moved by the test. Wall and monotonic time differ by
    an arbitrary offset, as they do on a real machine."""

    def __init__(self, wall: float = 1_000_000.0, mono: float = 5_000.0) -> None:
        self._wall = wall
        self._mono = mono

    def wall(self) -> float:
        return self._wall

    def mono(self) -> float:
        return self._mono

    def advance(self, seconds: float) -> None:
        self._wall += seconds
        self._mono += seconds


class FakeAgent(NodeAgent):
    """Answers every poll with ``reply`` (set by the test) and logs with ``logs``."""

    reply: NodeStatus | None = None
    logs: dict[int, str]

    def __init__(self, node: NodeSpec) -> None:
        super().__init__(node)
        self.logs = {}

    def poll(self, gen_dir: str, ranks: list[int]) -> NodeStatus:
        assert self.reply is not None, "set FakeAgent.reply before observing"
        return self.reply

    def log_tail(self, gen_dir: str, rank: int, max_bytes: int = 65536) -> str:
        return self.logs.get(rank, "")[-max_bytes:]

    def start_ranks(self, gen_dir: str, ranks: list[RankLaunch]) -> list[StartedRank]:
        raise NotImplementedError

    def stop(self, *args: object, **kwargs: object) -> NodeStopResult:
        raise NotImplementedError

    def end_run(self, run_root: str, memory_dirs: list[str]) -> None:
        raise NotImplementedError

    def preflight(self, request: PreflightRequest) -> PreflightResult:
        raise NotImplementedError

    def write_file(self, path: str, content: str) -> None:
        raise NotImplementedError
