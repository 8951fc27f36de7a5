"""``python -m lazarus.rank.replica_restore send|receive``: a replica's restore, node to node.

After a node loss the checkpoint search may choose a step that the spare lacks but
the lost node's buddy holds as a replica. The controller then starts this module on
both nodes at once (through the node agent: a local process, the shim over ssh, or
a Slurm step) and waits for their two answers; the state flows from the holder's
tmpfs straight into the spare's over :mod:`lazarus.rank.transfer`, never through the
controller, which holds only addresses and the restore's key.

* ``receive`` (on the spare): listens on the address it is given, waits for one peer
  that proves the key (a squatter that connects first is closed and waited past),
  streams the files into a hidden directory beside the step's, checks every hash
  and the manifest (job, step, sizes), writes ``COMMITTED`` and renames the
  directory into place. Answers ``{"received": step, "bytes": N, "seconds": S}``.
* ``send`` (on the holder): streams the committed replica there, retrying the
  connection while the receiver starts. Answers ``{"sent": N, "seconds": S}``.

The request, key included, is one JSON object on stdin, never an argument (argv is
world-readable in ``/proc``); any failure is ``{"error": reason}``, and nothing is
left under the step's name. Paths are logical (the memory tier's root), mapped to the
user's private root on the node and checked like every write in the tier.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lazarus.domain import checkpoint_layout, memory_tier
from lazarus.rank import memory, replica, transfer

ACCEPT_WAIT_S = 60.0
"""How long the receiving end waits for its sender to connect and prove the key."""


@dataclass(frozen=True)
class RestoreRequest:
    """One end of a restore (``send`` or ``receive``), as the controller sends it."""

    key: bytes
    address: str
    """``host:port``: where ``receive`` listens, and ``send`` connects."""
    path: str
    """``send``: the replica's step directory; ``receive``: the step directory to fill."""
    step: int
    job_id: str | None
    timeout_s: float

    @staticmethod
    def parse(text: str) -> RestoreRequest:
        """The request, or ValueError naming the field (never its value: the key)."""
        try:
            raw = json.loads(text)
        except ValueError:
            raise ValueError("the request on stdin is not JSON") from None
        if not isinstance(raw, dict):
            raise ValueError("the request on stdin is not an object")
        try:
            key = bytes.fromhex(str(raw["key"]))
        except (KeyError, ValueError):
            raise ValueError("key: missing or not hex") from None
        for name, kind in (("address", str), ("path", str), ("step", int), ("timeout_s", float)):
            value = raw.get(name)
            if kind is float and isinstance(value, int) and not isinstance(value, bool):
                value = float(value)
            if not isinstance(value, kind) or isinstance(value, bool):
                raise ValueError(f"{name}: missing or not a {kind.__name__}")
        job_id = raw.get("job_id")
        if job_id is not None and not isinstance(job_id, str):
            raise ValueError("job_id: not a string")
        return RestoreRequest(
            key, raw["address"], raw["path"], raw["step"], job_id, float(raw["timeout_s"])
        )


def on_this_node(path: str) -> Path:
    return Path(memory_tier.on_node(path, os.getuid()))


def send(request: RestoreRequest) -> dict[str, Any]:
    source = on_this_node(request.path)
    memory.secure(source.parent, create=False)
    if source.is_symlink() or not checkpoint_layout.is_committed(source):
        return {"error": f"{request.path} is not a committed replica on this node"}
    started = time.monotonic()
    fields = {"job_id": request.job_id, "step": request.step, "restore": True}
    names = replica.snapshot_files(source)
    sent = transfer.send(
        replica.parse_address(request.address),
        request.key,
        source,
        names,
        fields,
        connect_until=started + request.timeout_s,
        digests=replica.known_digests(source, names),
    )
    return {"sent": sent, "seconds": round(time.monotonic() - started, 3)}


def receive(request: RestoreRequest) -> dict[str, Any]:
    target = on_this_node(request.path)
    parent = memory.secure(target.parent, create=True)
    parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    host, port = replica.parse_address(request.address)
    deadline = time.monotonic() + request.timeout_s
    incoming: list[Path] = []

    def judge(offer: transfer.Offer) -> Path | str:
        if offer.fields.get("step") != request.step or offer.fields.get("job_id") != request.job_id:
            return "an offer of another step or job than this restore's"
        if offer.files[-1][0] != checkpoint_layout.MANIFEST:
            return f"{checkpoint_layout.MANIFEST} must come last"
        directory = parent / f"{replica.INCOMING_PREFIX}{secrets.token_hex(8)}"
        os.mkdir(directory, 0o700)
        incoming.append(directory)
        return directory

    def commit(received: transfer.Received) -> str | None:
        problem = checkpoint_layout.size_problem(received.directory)
        if problem is not None:
            return f"torn: {problem}"
        manifest = json.loads((received.directory / checkpoint_layout.MANIFEST).read_text())
        if manifest.get("job_id") != request.job_id or manifest.get("step", request.step) != (
            request.step
        ):
            return "its manifest names another job or step"
        marker = {"step": request.step, "committed_at": time.time(), "restored": True}
        with open(
            os.open(
                received.directory / checkpoint_layout.COMMIT_MARKER,
                os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW,
                0o600,
            ),
            "w",
        ) as handle:
            json.dump(marker, handle)
        replica._remove(target)
        os.rename(received.directory, target)
        return None

    started = time.monotonic()
    try:
        with socket.create_server((host, port), backlog=4) as server:
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    return {"error": f"no sender proved the key within {request.timeout_s:g} s"}
                server.settimeout(min(left, 1.0))
                try:
                    conn, _ = server.accept()
                except TimeoutError:
                    continue
                with conn:
                    outcome = transfer.receive(conn, request.key, judge, commit)
                if isinstance(outcome, transfer.Received):
                    return {
                        "received": request.step,
                        "bytes": outcome.bytes,
                        "seconds": round(time.monotonic() - started, 3),
                        # From the sender's go to the commit: the state's own movement.
                        "copy_seconds": round(outcome.seconds, 3),
                    }
                if not outcome.endswith(transfer.UNPROVEN):
                    return {"error": outcome}  # the real sender, refused: no second try
    finally:
        for directory in incoming:
            replica._remove(directory)


def run(verb: str, text: str) -> dict[str, Any]:
    """One end of a restore, as an answer (never raises)."""
    try:
        request = RestoreRequest.parse(text)
    except ValueError as exc:
        return {"error": f"replica restore: bad request: {exc}"}
    try:
        if verb == "send":
            return send(request)
        if verb == "receive":
            return receive(request)
    except (OSError, ValueError, transfer.TransferRefused) as exc:
        return {"error": f"replica restore ({verb}): {type(exc).__name__}: {exc}"}
    return {"error": f"replica restore: unknown verb {verb!r} (send or receive)"}


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    answer = run(args[0] if args else "", sys.stdin.read())
    print(json.dumps(answer), flush=True)
    return 0 if "error" not in answer else 1


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
