"""The list-cache benchmark's client (tests/bench_lists.sh): SESSIONS Streamable HTTP sessions
on URL each send tools/list, one at a time, for SECONDS; prints one JSON line with the lists
answered and the calls per second. Standard library only."""
import http.client
import json
import sys
import threading
import time
from urllib.parse import urlparse

url, sessions, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
target = urlparse(url)
HEADERS = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}


def post(conn, body, sid=None):
    headers = dict(HEADERS)
    if sid:
        headers["Mcp-Session-Id"] = sid
        headers["MCP-Protocol-Version"] = "2025-06-18"
    conn.request("POST", target.path, json.dumps(body), headers)
    response = conn.getresponse()
    data = response.read()
    return response, data


answered = [0] * sessions
start = threading.Barrier(sessions + 1)


def run(n):
    conn = http.client.HTTPConnection(target.hostname, target.port, timeout=30)
    init = {"jsonrpc": "2.0", "id": 0, "method": "initialize",
            "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                       "clientInfo": {"name": "list-bench", "version": "1"}}}
    response, _ = post(conn, init)
    sid = response.getheader("Mcp-Session-Id")
    post(conn, {"jsonrpc": "2.0", "method": "notifications/initialized"}, sid)
    start.wait()
    deadline = time.monotonic() + seconds
    i = 0
    while time.monotonic() < deadline:
        i += 1
        response, data = post(conn, {"jsonrpc": "2.0", "id": i, "method": "tools/list"}, sid)
        if response.status == 200 and b'"tools"' in data:
            answered[n] += 1


threads = [threading.Thread(target=run, args=(n,)) for n in range(sessions)]
for t in threads:
    t.start()
start.wait()
began = time.monotonic()
for t in threads:
    t.join()
elapsed = time.monotonic() - began
print(json.dumps({"lists": sum(answered), "seconds": round(elapsed, 2),
                  "per_second": round(sum(answered) / elapsed, 1)}))
