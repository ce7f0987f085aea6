"""Official Python MCP SDK clients keep their sessions while the backend is killed and restarted.

Usage: sdk_restart.py BASE_URL RECORD_FILE URI TRANSPORT [TRANSPORT ...]   (TRANSPORT: sse or mcp)

Drives Switchboard in front of `test-backend` (started with TEST_BACKEND_RECORD=RECORD_FILE):
one SDK client per TRANSPORT, all at once, `sse` being the legacy HTTP+SSE client
(`sse_client`, BASE_URL/sse) and `mcp` the Streamable HTTP one (`streamable_http_client`,
BASE_URL/mcp). Each client:

1. initializes, lists the tools, subscribes to a uri of its own, URI/TRANSPORT-N
   (`resources/subscribe`), calls `touch` on it (the backend notifies `resources/updated`
   for a uri it holds a subscription to) and waits for that notification;
2. starts `delay {ms: 60000}`, a call that is still in flight when the backend dies, and waits
   until the backend has read it (its line is in RECORD_FILE).

Once every client is there, the script reads the backend's pid from BASE_URL/health and kills
it (SIGKILL). Then each client, on the session it already has (it never initializes again):

3. collects the outcome of the call in flight (the proxy answers it with an error);
4. calls `echo` and gets its answer from the restarted backend;
5. calls `touch` again and waits for a `resources/updated` for its uri (only a subscription
   the proxy renewed reaches the new process);
6. waits for the three `notifications/*/list_changed` the proxy sends after a restart.

Every wait is bounded (WAIT_S); a missed one fails the script with what the client had seen.
Prints one JSON line on stdout: {"pids": [killed, after], "clients": [{"transport", "uri",
"sessions": [every session id its requests carried], "methods": [every JSON-RPC method it
sent, in order], "in_flight": {"code", "message"} or {"result"}, "echo": args echoed after
the restart, "touched": [touch results], "before": [notifications received before the kill],
"after": [those received after it]}]}, a notification written as its method, followed by
` URI` for `resources/updated`.
Exits non-zero (with a traceback) on any failure.
"""

import json
import os
import signal
import sys
import warnings
from urllib.parse import parse_qs, urlparse

import anyio
import httpx2
from mcp import ClientSession, MCPError
from mcp.client.sse import sse_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

# Every wait for something that must happen; never a measure of speed.
WAIT_S = 30
# The whole run, a last resort.
TIMEOUT_S = 150
# The call in flight when the backend dies: far longer than the test takes.
IN_FLIGHT_MS = 60_000
LIST_CHANGED = [f"notifications/{what}/list_changed" for what in ("tools", "resources", "prompts")]
UPDATED = "notifications/resources/updated"

# `resources/subscribe` is deprecated for the 2026 revisions; the backend speaks 2024-11-05.
warnings.simplefilter("ignore")


class Wire:
    """What one client sends over HTTP: the session ids its requests carry and the methods."""

    def __init__(self, kind):
        self.kind = kind
        self.sessions = []
        self.methods = []

    async def on_request(self, request):
        if self.kind == "mcp":
            sid = request.headers.get("mcp-session-id")
        else:
            sid = (parse_qs(urlparse(str(request.url)).query).get("session_id") or [None])[0]
        if sid is not None and sid not in self.sessions:
            self.sessions.append(sid)
        if request.method == "POST":
            try:
                body = json.loads(request.content)
            except ValueError:
                return
            for message in body if isinstance(body, list) else [body]:
                if isinstance(message, dict) and "method" in message:
                    self.methods.append(message["method"])

    def http_client(self, **kwargs):
        client = create_mcp_http_client(**kwargs)
        client.event_hooks["request"].append(self.on_request)
        return client

    def transport(self, base_url):
        if self.kind == "sse":
            return sse_client(
                f"{base_url}/sse",
                timeout=WAIT_S,
                sse_read_timeout=TIMEOUT_S,
                httpx_client_factory=self.http_client,
            )
        if self.kind == "mcp":
            client = self.http_client(timeout=httpx2.Timeout(WAIT_S, read=TIMEOUT_S))
            return streamable_http_client(f"{base_url}/mcp", http_client=client)
        raise SystemExit(f"unknown transport {self.kind!r} (sse or mcp)")


class Heard:
    """The notifications one client received, in order, and a way to wait for them."""

    def __init__(self):
        self.methods = []
        self.changed = anyio.Event()

    async def __call__(self, message):
        if isinstance(message, Exception):
            self.methods.append(f"exception: {message!r}")
        else:
            inner = getattr(message, "root", message)
            method = getattr(inner, "method", repr(inner))
            if method == UPDATED:
                method = f"{method} {inner.params.uri}"
            self.methods.append(method)
        self.changed.set()

    async def until(self, what, pred):
        with anyio.move_on_after(WAIT_S):
            while not pred(self.methods):
                self.changed = anyio.Event()
                await self.changed.wait()
            return
        raise SystemExit(f"{what}: not within {WAIT_S} s; notifications so far: {self.methods}")


def texts(result):
    return [c.text for c in result.content if getattr(c, "type", None) == "text"]


async def wait_recorded(record, needle, what):
    with anyio.move_on_after(WAIT_S):
        while True:
            try:
                with open(record, encoding="utf-8", errors="replace") as f:
                    if needle in f.read():
                        return
            except FileNotFoundError:
                pass
            await anyio.sleep(0.05)
    raise SystemExit(f"{what}: the backend did not receive it within {WAIT_S} s")


async def backend_pid(http, base_url):
    """The running backend's pid from /health (waits while it is down)."""
    with anyio.move_on_after(WAIT_S):
        while True:
            health = (await http.get(f"{base_url}/health")).json()
            pid = health.get("backend", {}).get("pid")
            if health.get("backend", {}).get("running") and pid:
                return pid
            await anyio.sleep(0.05)
    raise SystemExit(f"no running backend in /health within {WAIT_S} s")


async def one_client(base_url, record, uri_prefix, index, wire, ready, killed, results):
    heard = Heard()
    uri = f"{uri_prefix}/{wire.kind}-{index}"
    updated = f"{UPDATED} {uri}"
    async with wire.transport(base_url) as (read, write):
        async with ClientSession(read, write, message_handler=heard) as session:
            await session.initialize()
            names = [t.name for t in (await session.list_tools()).tools]
            for tool in ("touch", "delay", "echo"):
                if tool not in names:
                    raise SystemExit(f"{wire.kind}: tool {tool!r} not listed: {names}")
            await session.subscribe_resource(uri)
            touched = [json.loads(texts(await session.call_tool("touch", {"uri": uri}))[0])]
            await heard.until(f"{wire.kind}: resources/updated before the kill", lambda m: updated in m)

            outcome = {}
            marker = f"in-flight-{wire.kind}-{index}"

            async def in_flight():
                try:
                    r = await session.call_tool("delay", {"ms": IN_FLIGHT_MS, "marker": marker})
                    outcome["result"] = texts(r)
                except MCPError as e:
                    outcome.update(code=e.code, message=e.message)

            async with anyio.create_task_group() as tg:
                tg.start_soon(in_flight)
                await wait_recorded(record, marker, f"{wire.kind}: the call in flight")
                # Taken before the kill (the script kills once every client is ready).
                kill_seen = len(heard.methods)
                ready.set()
                await killed.wait()
                with anyio.move_on_after(WAIT_S):
                    while not outcome:
                        await anyio.sleep(0.05)
                if not outcome:
                    tg.cancel_scope.cancel()
                    raise SystemExit(f"{wire.kind}: the call in flight got no answer within {WAIT_S} s of the kill")

            args = {"after": "restart", "transport": wire.kind, "index": index}
            echoed = texts(await session.call_tool("echo", args))
            touched.append(json.loads(texts(await session.call_tool("touch", {"uri": uri}))[0]))
            await heard.until(
                f"{wire.kind}: resources/updated for {uri} after the restart",
                lambda m: updated in m[kill_seen:],
            )
            await heard.until(
                f"{wire.kind}: the three list_changed after the restart",
                lambda m: all(x in m[kill_seen:] for x in LIST_CHANGED),
            )
            results[index] = {
                "transport": wire.kind,
                "uri": uri,
                "sessions": wire.sessions,
                "methods": wire.methods,
                "in_flight": outcome,
                "echo": json.loads(echoed[0]) if echoed else None,
                "touched": touched,
                "before": heard.methods[:kill_seen],
                "after": heard.methods[kill_seen:],
            }


async def main(base_url, record, uri, kinds):
    results = [None] * len(kinds)
    readies = [anyio.Event() for _ in kinds]
    killed = anyio.Event()
    pids = []
    with anyio.fail_after(TIMEOUT_S):
        async with httpx2.AsyncClient(timeout=WAIT_S) as http, anyio.create_task_group() as tg:
            for i, kind in enumerate(kinds):
                tg.start_soon(one_client, base_url, record, uri, i, Wire(kind), readies[i], killed, results)
            for ready in readies:
                await ready.wait()
            pid = await backend_pid(http, base_url)
            pids.append(pid)
            os.kill(pid, signal.SIGKILL)
            killed.set()
            # The new process, once it runs (the proxy restarts it after a short back-off).
            with anyio.move_on_after(WAIT_S):
                while (after := await backend_pid(http, base_url)) == pid:
                    await anyio.sleep(0.05)
                pids.append(after)
    print(json.dumps({"pids": pids, "clients": results}), flush=True)


if __name__ == "__main__":
    if len(sys.argv) < 5:
        raise SystemExit(__doc__)
    anyio.run(main, sys.argv[1].rstrip("/"), sys.argv[2], sys.argv[3], sys.argv[4:])
