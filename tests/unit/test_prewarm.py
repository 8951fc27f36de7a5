"""Prewarming the spares' zygotes (issue 28): which spares a launch prewarms, what a
node agent that cannot prewarm answers, and how the launch records it. No process
starts here: the ssh path is tests/integration/test_shim_warm.py and
tests/netns/test_ssh_spares.py."""

from __future__ import annotations

from pathlib import Path

from activities.launcher import Prewarmed, _prewarm_spares, prewarm_targets, warm_start_outcome
from activities.nodes.local.agent import LocalAgent
from activities.nodes.node_records import RankLaunch, StartedRank, WarmStart
from activities.nodes.rundir import GenerationDir
from activities.nodes.shim_calls import warm_call
from lazarus.domain.contracts import LaunchRequest
from lazarus.domain.spec import JobSpec, NodeSpec

SPEC = JobSpec.model_validate(
    {
        "name": "j",
        "command": ["python", "t.py"],
        "workdir": "/w",
        "nodes": [{"name": "a"}, {"name": "b"}],
        "spares": [{"name": "s"}],
        "warm_start": {"preload": ["json"]},
    }
)
WARM = WarmStart(run_root="/runs/j/run-1", preload=["json"], standby=0)


def test_a_launch_never_prewarms_a_node_that_runs_its_ranks() -> None:
    a, b, s = (NodeSpec(name=n) for n in "abs")
    request = LaunchRequest(spec=SPEC, generation=2, nodes=[a, s], prewarm=[s, b])
    assert [n.name for n in prewarm_targets(request, [a, s])] == ["b"]
    assert prewarm_targets(LaunchRequest(spec=SPEC, generation=1), [a, b]) == []


def test_an_agent_that_cannot_prewarm_starts_nothing_and_says_so() -> None:
    launch = RankLaunch(rank=4, command=["python", "t.py"], env={}, workdir="/w")
    agent = LocalAgent(NodeSpec(name="s"))
    assert agent.prewarm(launch, WARM) == agent.prewarm_unsupported


def test_the_launch_records_the_spares_it_could_not_prewarm(tmp_path: Path) -> None:
    """Local spares cannot be prewarmed: each is noted with the reason, and the launch
    goes on (its outcome only gains the line)."""
    a, b, s = (NodeSpec(name=n) for n in "abs")
    request = LaunchRequest(spec=SPEC, generation=1, prewarm=[s])
    gen = GenerationDir.of(tmp_path, 1)
    done = _prewarm_spares(request, [s], [a, b], gen, 29500, WARM)
    assert done == Prewarmed(failed=[f"s: {LocalAgent.prewarm_unsupported}"])


def test_the_outcome_names_the_spares_prewarmed_and_why_others_were_not() -> None:
    started = StartedRank(rank=0, pid=1, pgid=1, start_ticks=1, log_file="l", warm=True)
    done = Prewarmed(nodes=["s"], failed=["t: no route to host"])
    outcome = warm_start_outcome([NodeSpec(name="a")], [[started]], done)
    assert outcome.prewarmed == ["s"] and outcome.not_prewarmed == ["t: no route to host"]
    assert outcome.summary() == (
        "warm start: 1 warm (0 from standby), 0 cold; spares prewarmed: s; "
        "spares not prewarmed: t: no route to host"
    )
    assert "prewarm" not in warm_start_outcome([NodeSpec(name="a")], [[started]]).summary()


def test_only_a_prewarm_request_names_the_field_an_older_node_would_refuse() -> None:
    """A node running an older Lazarus refuses unknown request fields: a plain warm
    start must not send ``prewarm``, so it keeps working on such a node."""
    launch = RankLaunch(rank=0, command=["python", "t.py"], env={"PATH": "/usr/bin"}, workdir="/w")
    plain = warm_call("/runs/gen-00001", "a", [launch], WARM)
    asked = warm_call("/runs/.zygote-a", "a", [launch], WARM, prewarm=True)
    assert '"prewarm"' not in plain.stdin
    assert '"prewarm":true' in asked.stdin and asked.argv[1] == "/runs/.zygote-a"
