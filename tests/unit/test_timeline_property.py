"""The timeline invariant, checked against random sequences of events (issue 37).

``docs/guides/guarantees.md``, invariant 3: at every launch the chosen resume point
is never on a timeline the job has left (nor at or above a rollback's bound), never
newer than the newest surviving copy, and no usable checkpoint of the current
timeline is newer than it. Broken three times by three paths nobody listed (the
memory tier, then the preflight beside the search: the audit's N1), so it is
checked here against sequences, not cases: :mod:`tests.timeline_model` drives the
product's own pure policy (the playbook, the state's timeline moves, the node pool
and the preflight's outcome, the search request, ``memory_tier.choose``) through
snapshots and disk commits per node, uploads, crashes, NaN rollbacks, node loss
with and without replicas, preflight escalations, an operator's return, resume and
recovery, a fleet's new node and continue-as-new, and an oracle that knows only
which state each generation resumed from says whether each launch kept it.

The fast tier runs the same 1,200 sequences every time (derandomized, in four
tests of one event mix each, under its CPU limit); ``make test-all``
(``LAZARUS_TEST_ALL=1``) runs 50,000 new random ones, 12,500 a mix.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

from lazarus.domain.failure_classes import FailureClass
from tests.tiers import only_in_test_all
from tests.timeline_model import Cluster, Config

TRAIN, TORN, UPLOAD, CRASH, NAN, NODE_LOSS, BAD_PREFLIGHT = range(7)
RETURN, RESUME, FLEET, RECOVER, CONTINUE_AS_NEW = range(7, 12)

MAX_EVENTS = 24
"""At most 25 launches a sequence: under the ``MAX_CUTS`` relaunches whose cuts the
state keeps apart exactly (older ones merge, and may pass a snapshot over)."""

SEQUENCES = st.binary(min_size=1, max_size=1 + MAX_EVENTS)
"""A sequence as bytes (the first: the cluster; then one an event): Hypothesis draws
and shrinks bytes far faster than lists of tuples, which is what lets the fast tier
afford thousands of sequences. Shrunk, a failure reads as few events on 2 nodes."""

FAST = settings(
    max_examples=300,
    derandomize=True,  # the same sequences each run: the fast tier never flakes
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
"""Per fast test: 400 sequences (four tests: 1,600; 550 took up to 2.1 s of CPU on a
loaded machine, over the fast tier's 2 s)."""
LONG = settings(FAST, max_examples=12_500, derandomize=False)
"""Per event mix in ``make test-all``: 12,500 new random sequences (50,000)."""

EVERY_EVENT = (
    TRAIN,
    TORN,
    UPLOAD,
    CRASH,
    NAN,
    NODE_LOSS,
    BAD_PREFLIGHT,
    RETURN,
    RESUME,
    FLEET,
    RECOVER,
    CONTINUE_AS_NEW,
    TRAIN,
    TRAIN,
    TRAIN,
    TRAIN,
)
"""Event kinds by the low 4 bits of a byte: most of a job's life is training."""


def decode(data: bytes, kinds: tuple[int, ...]) -> tuple[Config, list[tuple[int, int]]]:
    """The cluster and the events ``data`` stands for: each event byte's low 4 bits
    pick a kind from ``kinds`` (16 of them), its top 3 bits the argument (0 to 7)."""
    first = data[0]
    config = Config(
        nodes=2 + (first & 1),
        spares=(first >> 1) & 1,
        replicas=bool(first & 4),
        shrinks=bool(first & 8),
        disk_every=2 + (first >> 4) % 4,
        memory_keep=1 + (first >> 6) % 3,
    )
    return config, [(kinds[byte & 15], byte >> 5) for byte in data[1:]]


def play(config: Config, events: list[tuple[int, int]]) -> Cluster:
    """Run ``events`` on a fresh cluster; every launch checks the invariant. A job
    left waiting gets its nodes back and is resumed at the end, so the decision it
    was waiting with is checked too."""
    cluster = Cluster(config)
    for kind, argument in events:
        if kind == UPLOAD:
            cluster.upload()
        elif kind == CRASH:
            cluster.fail(FailureClass.UNKNOWN)
        elif kind == NAN:
            cluster.fail(FailureClass.NUMERICAL, rollback_fails=argument == 7)
        elif kind == NODE_LOSS:
            cluster.lose_node(argument)
        elif kind == BAD_PREFLIGHT:
            cluster.bad_preflight(argument)
        elif kind == RETURN:
            cluster.operator_return(argument)
        elif kind == RESUME:
            cluster.operator_resume()
        elif kind == FLEET:
            cluster.fleet_grants_node()
        elif kind == RECOVER:
            cluster.operator_recover(checkpoint_first=argument % 2 == 0)
        elif kind == CONTINUE_AS_NEW:
            cluster.continue_as_new()
        else:
            cluster.train(argument + 1, torn=kind == TORN)
    while cluster.state.pool.quarantined:
        cluster.operator_return(0)
    cluster.operator_resume()
    return cluster


def check(data: bytes, kinds: tuple[int, ...]) -> None:
    config, events = decode(data, kinds)
    note(f"{config}, events {events}")
    play(config, events)


@FAST
@given(SEQUENCES)
def test_the_resume_point_never_leaves_the_timeline(data: bytes) -> None:
    check(data, EVERY_EVENT)


DETOURS = (
    TRAIN,
    TRAIN,
    TRAIN,
    TORN,
    UPLOAD,
    NAN,
    NAN,
    NAN,
    CRASH,
    BAD_PREFLIGHT,
    BAD_PREFLIGHT,
    RETURN,
    RESUME,
    RESUME,
    FLEET,
    CONTINUE_AS_NEW,
)
"""Rollbacks beside preflights that escalate, then a resume or a fleet's node: N1's
neighbourhood, more often than every event alike reaches it."""


@FAST
@given(SEQUENCES)
def test_a_rollback_is_kept_through_escalations_resumes_and_re_asks(data: bytes) -> None:
    check(data, DETOURS)


LOSSES = (
    TRAIN,
    TRAIN,
    TRAIN,
    TORN,
    TORN,
    UPLOAD,
    NODE_LOSS,
    NODE_LOSS,
    NODE_LOSS,
    CRASH,
    NAN,
    RETURN,
    RESUME,
    FLEET,
    RECOVER,
    CONTINUE_AS_NEW,
)
"""Node losses (with buddy replicas or not, by the cluster byte) amid snapshots that
some nodes committed and others did not."""


@FAST
@given(SEQUENCES)
def test_node_losses_never_skip_a_usable_snapshot_nor_take_a_left_one(data: bytes) -> None:
    check(data, LOSSES)


OPERATOR = (
    TRAIN,
    TRAIN,
    TRAIN,
    UPLOAD,
    NAN,
    NAN,
    CRASH,
    NODE_LOSS,
    BAD_PREFLIGHT,
    RETURN,
    RETURN,
    RESUME,
    RECOVER,
    RECOVER,
    CONTINUE_AS_NEW,
    CONTINUE_AS_NEW,
)
"""An operator's hands on it (return, resume, recover with and without a save first)
and continue-as-new between any two of them."""


@FAST
@given(SEQUENCES)
def test_operator_moves_and_continue_as_new_keep_the_timeline(data: bytes) -> None:
    check(data, OPERATOR)


@pytest.mark.slow  # 50,000 sequences: about 25 s of CPU per event mix
@pytest.mark.timeout(900)
@only_in_test_all("the long run of the timeline property")
@pytest.mark.parametrize(
    "kinds",
    [EVERY_EVENT, DETOURS, LOSSES, OPERATOR],
    ids=["every-event", "detours", "losses", "operator"],
)
def test_the_long_run_of_random_sequences_keeps_the_timeline(kinds: tuple[int, ...]) -> None:
    @LONG
    @given(SEQUENCES)
    def run(data: bytes) -> None:
        check(data, kinds)

    run()
