"""Real kernels of the in-process Jupyter server, for the attribution tests (here and in tests/gpu):
a fixture that opens notebook sessions and runs code in their kernels, the route's answer, and the
comm the sidebar's "Unload model" opens."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from pathlib import Path

import pytest

from nvkit import kernel_report


@pytest.fixture
def notebooks(jp_fetch, jp_serverapp, jp_root_dir):
    """``await start(path)`` opens a session (a real ipykernel) for a notebook path; returns
    ``(kernel_id, pid, run)`` where ``await run(code)`` executes code in it and returns stdout."""
    started, clients = [], []

    async def open_session(path: str):
        r = await jp_fetch("api", "sessions", method="POST", body=json.dumps(
            {"path": path, "name": Path(path).name, "type": "notebook",
             "kernel": {"name": "python3"}}))
        s = json.loads(r.body)
        started.append(s["id"])
        km = jp_serverapp.kernel_manager.get_kernel(s["kernel"]["id"])
        client = km.client()
        client.start_channels()
        clients.append(client)
        return s, km, client

    async def start(path: str):
        (jp_root_dir / path).parent.mkdir(parents=True, exist_ok=True)
        s, km, client = await open_session(path)
        try:
            await client.wait_for_ready(timeout=90)
        except RuntimeError:
            # jupyter_client picks free ports and the kernel binds them a moment later: a test worker
            # starting kernels beside this one can take a port in between ("Address already in
            # use"), and the kernel dies. A new session gets new ports.
            await jp_fetch("api", "sessions", s["id"], method="DELETE")
            s, km, client = await open_session(path)
            await client.wait_for_ready(timeout=90)
        kid = s["kernel"]["id"]

        async def run(code: str, timeout: float = 120) -> str:
            out = []

            def hook(msg):
                if msg["msg_type"] == "stream":
                    out.append(msg["content"]["text"])
                elif msg["msg_type"] == "error":
                    out.append("\n".join(msg["content"]["traceback"]))
            reply = await client.execute_interactive(code, output_hook=hook, timeout=timeout)
            assert reply["content"]["status"] == "ok", "".join(out)
            return "".join(out)

        run.client = client
        run.report = Path(km.connection_file).parent / kernel_report.report_name(kid)
        return kid, km.provisioner.pid, run

    yield start
    for c in clients:
        c.stop_channels()


async def gpus(jp_fetch) -> list[dict]:
    r = await jp_fetch("nvkit", "api", "gpus")
    data = json.loads(r.body)
    assert data["attribution"]["ok"], data["attribution"]
    return data["gpus"]


async def wait_for(jp_fetch, check, timeout: float = 30):
    """Poll the route until ``check(gpus)`` is truthy; return the last answer."""
    deadline = time.monotonic() + timeout
    while True:
        gs = await gpus(jp_fetch)
        if check(gs) or time.monotonic() > deadline:
            return gs
        await asyncio.sleep(0.3)


async def open_unload_comm(client, timeout: float = 60) -> dict:
    """Open a comm to ``nvkit.unload`` as JupyterLab does and return the kernel's answer."""
    comm_id = uuid.uuid4().hex
    msg = client.session.msg("comm_open", {"comm_id": comm_id, "target_name": "nvkit.unload",
                                           "data": {}})
    client.shell_channel.send(msg)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        m = await client.get_iopub_msg(timeout=timeout)
        if m["msg_type"] == "comm_msg" and m["content"]["comm_id"] == comm_id:
            return m["content"]["data"]
        if m["msg_type"] == "comm_close" and m["content"]["comm_id"] == comm_id:
            raise AssertionError("the kernel closed the comm without an answer")
    raise AssertionError("no answer from nvkit.unload")
