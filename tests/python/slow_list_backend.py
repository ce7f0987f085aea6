"""A stdio MCP server for the list-cache benchmark (tests/bench_lists.sh): it declares
tools.listChanged, answers each tools/list after LIST_DELAY_MS (default 5) of work, one at a
time as a serial stdio server does, and writes how many lists it answered to COUNT_FILE when
stdin closes."""
import json
import os
import sys
import time

delay = float(os.environ.get("LIST_DELAY_MS", "5")) / 1000
count_file = os.environ.get("COUNT_FILE")
lists = 0
TOOLS = [{"name": f"tool_{i}", "description": "A tool of the benchmark.",
          "inputSchema": {"type": "object", "properties": {"x": {"type": "string"}}}}
         for i in range(20)]

for line in sys.stdin:
    try:
        msg = json.loads(line)
    except ValueError:
        continue
    method, mid = msg.get("method"), msg.get("id")
    if mid is None:
        continue
    if method == "initialize":
        result = {"protocolVersion": msg["params"].get("protocolVersion", "2025-06-18"),
                  "capabilities": {"tools": {"listChanged": True}},
                  "serverInfo": {"name": "slow-list", "version": "1"}}
    elif method == "tools/list":
        time.sleep(delay)
        lists += 1
        result = {"tools": TOOLS}
    else:
        result = {}
    sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": mid, "result": result}) + "\n")
    sys.stdout.flush()

if count_file:
    with open(count_file, "w") as f:
        f.write(str(lists))
