"""`make demo`: the main job, on the embedded dev server, surviving a crash and a hang.

It starts a Temporal dev server (state under .lazarus/demo, Web UI on 8233 when
free) and a controller worker, starts examples/jobs/ddp_demo.yaml, and injects
two faults while you watch live status: SIGKILL of rank 1, then, once the job
has recovered, SIGSTOP of rank 0 (a hang: the process is alive but silent). It
ends with the incident table and the Web UI link, and stops everything it
started unless you pass --keep-running.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import signal
import socket
import sys
import time
from pathlib import Path

from rich.console import Console, Group
from rich.live import Live
from rich.text import Text

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from infra import chaos  # noqa: E402
from lazarus.app.cli_render import incidents_table, render_status  # noqa: E402
from lazarus.app.client import JobClient  # noqa: E402
from lazarus.app.local_stack import LocalStack  # noqa: E402
from lazarus.app.settings import web_ui_url  # noqa: E402
from lazarus.domain.api import workflow_id_for  # noqa: E402
from lazarus.domain.spec import JobSpec, load_spec  # noqa: E402
from workflows.state import JobStatus  # noqa: E402

SPEC = REPO / "examples" / "jobs" / "ddp_demo.yaml"
DEMO_JOB = "ddp-demo-showcase"
"""The demo runs the spec under a name of its own, so its checkpoints
(``.lazarus/checkpoints/{job_id}``) and output never meet those of the README's
walk-through, ``lazarus start examples/jobs/ddp_demo.yaml`` (job ``ddp-demo``),
which would otherwise resume from the demo's final step and train nothing."""
CRASH_AT_STEP = 80
HANG_AT_STEP = 180


def _port_free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def demo_spec() -> JobSpec:
    """ddp_demo.yaml as the demo job: its own name, checkpoints and output file."""
    spec = load_spec(SPEC, name_override=DEMO_JOB)
    command = list(spec.command)
    if "--out" in command:
        command[command.index("--out") + 1] = f".lazarus/out/{spec.name}/model.pt"
    return spec.model_copy(update={"command": command})


async def _run(stack: LocalStack, console: Console) -> JobStatus:
    spec = demo_spec()
    for leftover in (
        Path(spec.checkpoint_dir),
        Path(spec.run_dir) / spec.name,
        Path(spec.workdir) / ".lazarus/out" / spec.name,
    ):
        shutil.rmtree(leftover, ignore_errors=True)  # a demo starts from scratch
    jobs = await JobClient.connect(stack.settings)
    handle = await jobs.start(spec)
    console.print(
        f"started [bold]{spec.name}[/]: {spec.world_size} ranks, "
        f"Web UI {web_ui_url(stack.settings, handle.workflow_id)}"
    )
    run_root = Path(spec.run_dir) / spec.name
    events: list[str] = []
    plan = [(CRASH_AT_STEP, 1, signal.SIGKILL, "crash"), (HANG_AT_STEP, 0, signal.SIGSTOP, "hang")]
    with Live(console=console, refresh_per_second=4) as live:
        while True:
            view = await jobs.status(handle)
            generation, step = chaos.current_step(run_root)
            if plan and step is not None and step >= plan[0][0] and generation == len(events) + 1:
                _, rank, sig, label = plan.pop(0)
                fault = chaos.signal_rank(run_root, rank, sig)
                events.append(
                    f"{time.strftime('%H:%M:%S')} injected {label}: {sig.name} "
                    f"to rank {rank} (pid {fault.pid}) at step {fault.step}"
                )
            live.update(Group(render_status(view), Text("\n".join(events), style="yellow")))
            if view.is_terminal:
                break
            await asyncio.sleep(0.5)
    return await jobs.result(handle)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--keep-running",
        action="store_true",
        help="leave the dev server and worker up to explore the Web UI",
    )
    args = parser.parse_args(argv)
    console = Console()
    port, ui_port = (7233, 8233) if _port_free(7233) and _port_free(8233) else (None, None)
    stack = LocalStack(REPO / ".lazarus" / "demo", port=port, ui_port=ui_port, headless=False)
    console.print("starting the Temporal dev server and a Lazarus worker ...")
    stack.start()
    try:
        status = asyncio.run(_run(stack, console))
        console.print(incidents_table(status.incidents))
        ettr = f"{status.ettr:.1%}" if status.ettr is not None else "n/a"
        console.print(
            f"[bold]{status.phase}[/] at step {status.step} after "
            f"{status.generation} generations; ETTR {ettr}"
        )
        console.print(f"Web UI: {web_ui_url(stack.settings, workflow_id_for(status.job_id))}")
    finally:
        if args.keep_running:
            console.print(
                f"left running: dev server pid {stack.server.pid} at {stack.server.address}, "
                f"worker pid {stack.worker_pid}; stop them with kill"
            )
        else:
            stack.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
