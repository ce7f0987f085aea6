"""The red team's span-memory case (issue 40, SPEC 14): one legacy session makes 200 tools/call
with 1 MB tool names, every request sampled, at an OTLP collector that accepts and never
answers; prints the proxy's VmHWM. Usage: python3 tests/python/span_memory.py BINARY
(run from the repository root after cargo build --release)."""
import socket, subprocess, sys, threading, time, json, re, http.client, os
binary = sys.argv[1]
coll = socket.socket(); coll.bind(("127.0.0.1", 0)); coll.listen(64)
held = []
def collector():
    while True:
        c, _ = coll.accept(); held.append(c)
        threading.Thread(target=lambda c=c: [c.recv(1 << 20) for _ in iter(int, 1)], daemon=True).start()
threading.Thread(target=collector, daemon=True).start()
env = dict(os.environ, OTEL_TRACES_SAMPLER="always_on")
p = subprocess.Popen([binary, "--port", "0", "--otlp-endpoint", f"http://127.0.0.1:{coll.getsockname()[1]}", "--", "target/release/echo-backend"], stderr=subprocess.PIPE, env=env, text=True)
port = None
for line in p.stderr:
    m = re.search(r"127\.0\.0\.1:(\d+)", line)
    if "listening" in line and m: port = int(m.group(1)); break
threading.Thread(target=lambda: [None for _ in p.stderr], daemon=True).start()
s = socket.create_connection(("127.0.0.1", port))
s.sendall(b"GET /sse HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: text/event-stream\r\n\r\n")
buf = b""
while not re.search(rb"data: (\S+)\r?\n", buf): buf += s.recv(65536)
path = re.search(rb"data: (\S+)", buf).group(1).decode()
threading.Thread(target=lambda: [s.recv(1 << 20) for _ in iter(int, 1)], daemon=True).start()
def post(obj):
    c = http.client.HTTPConnection("127.0.0.1", port); c.request("POST", path, json.dumps(obj), {"Content-Type": "application/json"}); r = c.getresponse(); r.read(); c.close(); return r.status
post({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "rt", "version": "1"}}})
time.sleep(0.3)
post({"jsonrpc": "2.0", "method": "notifications/initialized"})
name = "a" * 1_000_000
for i in range(200):
    post({"jsonrpc": "2.0", "id": i + 1, "method": "tools/call", "params": {"name": name + str(i), "arguments": {}}})
time.sleep(8)
st = open(f"/proc/{p.pid}/status").read()
hwm = re.search(r"VmHWM:\s+(\d+)", st).group(1); rss = re.search(r"VmRSS:\s+(\d+)", st).group(1)
print(f"{os.path.basename(binary)}: VmHWM {int(hwm)/1024:.1f} MiB, VmRSS {int(rss)/1024:.1f} MiB, collector connections {len(held)}")
p.kill()
