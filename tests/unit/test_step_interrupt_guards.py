"""lazarus.rank.step_interrupt's guards, in process (the cut itself, with a real rank:
tests/integration/test_step_interrupt.py)."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator

import pytest

from lazarus.rank import step_interrupt

pytestmark = pytest.mark.skipif(
    step_interrupt.INTERRUPT_SIGNAL is None, reason="no real-time signals here"
)


@pytest.fixture
def restored_handler() -> Iterator[int]:
    signum = step_interrupt.INTERRUPT_SIGNAL
    assert signum is not None
    before = signal.getsignal(signum)
    try:
        yield signum
    finally:
        signal.signal(signum, before)
        step_interrupt._installed = False


def test_a_scripts_own_handler_is_kept(restored_handler: int) -> None:
    def mine(signum: int, frame: object) -> None: ...

    signal.signal(restored_handler, mine)
    assert not step_interrupt.install()
    assert signal.getsignal(restored_handler) is mine


def test_it_installs_only_from_the_main_thread(restored_handler: int) -> None:
    answers: list[bool] = []
    thread = threading.Thread(target=lambda: answers.append(step_interrupt.install()))
    thread.start()
    thread.join()
    assert answers == [False]
    assert step_interrupt.install()


def test_a_signal_outside_train_raises_nothing(restored_handler: int) -> None:
    assert step_interrupt.install()
    step_interrupt._pending_generation = 2  # as if the watch had signalled late
    signal.raise_signal(restored_handler)  # not armed: the handler lets it pass
    with step_interrupt.armed(enabled=False):
        signal.raise_signal(restored_handler)
