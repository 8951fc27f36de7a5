"""The Temporal Web UI explains a Lazarus job, checked in a real browser.

A dev server WITH its UI, a real worker and a real 2-rank DDP job with one crash; then
Debian's Chromium, driven by Playwright, opens the job's workflow page and reads what
a person would: the current details the workflow sets (phase, generation, the
incident), the start summary, the history's ``launch``, ``supervise`` and ``stop``
activities, and the workflow list filtered by ``LazarusFailureClass``. Screenshots go
to the test's temporary directory.

Playwright never downloads a browser here: it launches ``/usr/bin/chromium``, which
``make test`` installs as root (infra/install-test-prereqs.sh). Without Chromium or
Playwright the test skips and says why; under CI (env ``CI`` set) it fails instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import os
import re
import signal
import uuid
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from urllib.parse import quote

import pytest
from temporalio.client import Client
from temporalio.service import RPCError

from activities.stop import stop_generations
from infra import chaos
from lazarus.app.client import JobClient, JobHandle
from lazarus.app.devserver import DevServer
from lazarus.app.local_stack import LocalStack
from lazarus.domain.api import QUERY_STATUS
from lazarus.domain.contracts import StopRequest
from tests.e2e.conftest import ddp_spec, run_root
from workflows.state import JobStatus, Phase

CHROMIUM = Path("/usr/bin/chromium")
UI_DEADLINE_S = 90.0
"""How long the page may take to show what it must (a loaded 2-core machine)."""


def require_browser() -> None:
    """Skip (or fail under CI) when Chromium or Playwright is missing."""
    problems = []
    if not (CHROMIUM.is_file() and os.access(CHROMIUM, os.X_OK)):
        problems.append(
            f"{CHROMIUM} is missing (as root, make test installs Debian's chromium: "
            "infra/install-test-prereqs.sh)"
        )
    if importlib.util.find_spec("playwright") is None:
        problems.append("the playwright package is missing (pip install -e '.[dev]')")
    if not problems:
        return
    message = "browser test unavailable: " + "; ".join(problems)
    if os.environ.get("CI"):
        pytest.fail(f"{message} (CI is set: refusing to skip)", pytrace=False)
    pytest.skip(message)


@pytest.fixture
def ui_stack(tmp_path: Path) -> Iterator[LocalStack]:
    """Its own dev server, with the Web UI (the session's server is headless)."""
    require_browser()
    server = DevServer(tmp_path / "server", headless=False)
    stack = LocalStack(tmp_path / "stack", task_queue=f"ui-{uuid.uuid4().hex[:8]}", server=server)
    server.start()
    try:
        stack.start()
        yield stack
    finally:
        stack.kill_worker(signal.SIGKILL)
        server.stop()


REFRESH_EVERY_S = 15.0
"""A page whose first load failed under load (an API call timed out) never retries
by itself: reload it this often while waiting."""


class NotYet(Exception):
    """What a probe saw instead of what it waits for (shown if the wait runs out)."""


async def _wait(
    what: str,
    probe: Callable[[], Awaitable[str | None]],
    refresh: Callable[[], Awaitable[object]] | None = None,
) -> str:
    """Poll ``probe`` until it returns text (a deadline on progress, not speed).

    ``refresh`` (a page reload) runs every :data:`REFRESH_EVERY_S` between probes.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + UI_DEADLINE_S
    next_refresh = loop.time() + REFRESH_EVERY_S
    last = "nothing matched"
    while loop.time() < deadline:
        try:
            found = await probe()
        except Exception as exc:  # the page may still be loading
            last = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        else:
            if found is not None:
                return found
        await asyncio.sleep(1.0)
        if refresh is not None and loop.time() >= next_refresh:
            next_refresh = loop.time() + REFRESH_EVERY_S
            with contextlib.suppress(Exception):
                await refresh()
    raise TimeoutError(f"the Web UI never showed {what} ({last})")


async def _recovered(client: Client, job: JobHandle) -> JobStatus:
    handle = client.get_workflow_handle(job.workflow_id)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 120
    status: JobStatus | None = None
    while loop.time() < deadline:
        with contextlib.suppress(RPCError):
            status = await handle.query(QUERY_STATUS, result_type=JobStatus)
            if status.incidents and status.incidents[0].recovery_s is not None:
                return status
        await asyncio.sleep(0.5)
    raise TimeoutError(f"the crash was never recovered; last status: {status}")


@pytest.mark.timeout(400)
async def test_the_web_ui_explains_a_job_with_one_crash(
    ui_stack: LocalStack, tmp_path: Path
) -> None:
    from playwright.async_api import TimeoutError as PlaywrightTimeout
    from playwright.async_api import async_playwright

    server = ui_stack.server
    assert server.ui_url is not None
    client = await ui_stack.client()
    jobs = JobClient(client, task_queue=ui_stack.task_queue)
    # Long enough to still run while the browser looks (a few minutes at most).
    spec = ddp_spec(tmp_path, steps=6000, step_time=0.05, ckpt_every=20)
    job = await jobs.start(spec)
    try:
        await asyncio.to_thread(chaos.wait_for_step, run_root(spec), 25)
        chaos.signal_rank(run_root(spec), rank=1, sig=signal.SIGKILL)
        status = await _recovered(client, job)
        assert status.phase == Phase.RUNNING and status.generation == 2
        failure_class = status.incidents[0].failure_class.value

        page_url = f"{server.ui_url}/namespaces/default/workflows/{job.workflow_id}/{job.run_id}"
        async with async_playwright() as playwright:
            browser = await playwright.chromium.launch(
                executable_path=str(CHROMIUM),
                # Chromium refuses its sandbox as root; /dev/shm is small in containers;
                # the machine has no outside network, so nothing may try to reach it.
                args=[
                    "--no-sandbox",
                    "--disable-dev-shm-usage",
                    "--disable-background-networking",
                    "--disable-component-update",
                    "--disable-sync",
                    "--no-first-run",
                ],
            )
            page = await browser.new_page(viewport={"width": 1600, "height": 2000})
            # A navigation on a loaded 2-core machine may take longer than the 30 s default.
            page.set_default_navigation_timeout(UI_DEADLINE_S * 1000)
            try:
                # The history: every activity's type is on its "scheduled" row.
                await page.goto(f"{page_url}/history")

                async def activity_types() -> str | None:
                    text = await page.inner_text("body")
                    types = set(re.findall(r"Activity Type\s+(\w+)", text))
                    if {"launch", "supervise", "stop"} <= types:
                        return text
                    events = re.search(r"Event History\s*(\d+)", text)
                    raise NotYet(
                        f"activity types shown: {sorted(types) or 'none'}; "
                        f"events: {events.group(1) if events else 'not shown'}"
                    )

                history = await _wait(
                    "launch, supervise and stop in the history", activity_types, page.reload
                )
                assert "stop ranks: incident 1" in history, "the stop's summary names the incident"
                await page.screenshot(path=str(tmp_path / "web-ui-history.png"), full_page=True)

                # The user metadata: the start summary and the live current details
                # (the UI renders each markdown text in its own frame).
                await page.goto(page_url)

                async def open_user_metadata() -> str | None:
                    # Under load the tab can take longer than Playwright's 30 s default
                    # to render: a failed try reloads the page and tries again.
                    await page.click('[data-testid="user-metadata-tab"]', timeout=15_000)
                    return "opened"

                await _wait("the user metadata tab", open_user_metadata, page.reload)

                async def frame_text(frame_id: str, needle: str) -> str | None:
                    text = await page.frame_locator(f"#{frame_id}").locator("body").inner_text()
                    return text if needle in text else None

                summary = await _wait(
                    "the start summary",
                    lambda: frame_text("user-metadata-summary", spec.name),
                )
                assert f"Lazarus job {spec.name}: 2 ranks on 1 node(s)" in summary
                details = await _wait(
                    "the current details",
                    lambda: frame_text("user-metadata-current-details", "Waiting for"),
                )
                assert "RUNNING" in details and "generation 2" in details
                assert f"#1 crash (class {failure_class})" in details
                assert "rank 1 on local (SIGKILL)" in details and "recovered in" in details
                screenshot = tmp_path / "web-ui-current-details.png"
                await page.screenshot(path=str(screenshot), full_page=True)
                assert screenshot.stat().st_size > 10_000

                # The list, filtered as the README documents.
                query = quote(f'LazarusFailureClass="{failure_class}" AND LazarusGeneration=2')

                await page.goto(f"{server.ui_url}/namespaces/default/workflows?query={query}")

                async def listed() -> str | None:
                    try:
                        row = page.get_by_text(job.workflow_id, exact=True).first
                        await row.wait_for(timeout=15_000)
                    except PlaywrightTimeout:
                        await page.reload()  # visibility lags the upsert a little
                        return None
                    return job.workflow_id

                await _wait("the job in the filtered list", listed)
                await page.screenshot(path=str(tmp_path / "web-ui-list.png"), full_page=True)
            except BaseException:
                # What the page showed when it went wrong, for whoever reads the failure.
                with contextlib.suppress(Exception):
                    await page.screenshot(path=str(tmp_path / "web-ui-failure.png"))
                    (tmp_path / "web-ui-failure.txt").write_text(await page.inner_text("body"))
                raise
            finally:
                await browser.close()
    finally:
        with contextlib.suppress(RPCError):
            await client.get_workflow_handle(job.workflow_id).terminate("test teardown")
        await stop_generations(
            StopRequest(
                job_id=spec.job_id, run_root=str(run_root(spec)), grace_s=0, end_of_run=True
            )
        )
