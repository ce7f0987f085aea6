"""Memory of a proxy whose restart wait queue is offered big requests (issue 30.5).

    restart_memory.py PROXY_BINARY TEST_BACKEND [COUNT] [MIB]

Starts PROXY_BINARY on loopback in front of TEST_BACKEND (a restart of which sleeps a
minute before reading its stdin, so requests wait for it), opens a legacy session, makes
the backend exit, then sends COUNT (default 40) POSTs of MIB (default 8) MiB, one at a time,
each from a client that hangs up once it is sent; prints the proxy's VmRSS and VmHWM
(kB) as one JSON line, then stops it. Benchmark-style: prints figures, asserts nothing.
"""
import json, os, re, signal, socket, subprocess, sys, tempfile, time


def status_kb(pid, field):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def request(port, raw, read=True):
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(raw)
    data = s.recv(65536) if read else b""
    return s, data


def main():
    proxy, backend = sys.argv[1], sys.argv[2]
    count = int(sys.argv[3]) if len(sys.argv) > 3 else 40
    mib = int(sys.argv[4]) if len(sys.argv) > 4 else 8
    work = tempfile.mkdtemp(prefix="restart-memory.")
    marker = os.path.join(work, "started")
    script = f'if [ -e {marker} ]; then sleep 60; else touch {marker}; fi; exec {backend}'
    log = open(os.path.join(work, "log"), "w+")
    p = subprocess.Popen(
        [proxy, "--listen", "127.0.0.1:0", "--restart-wait", "60s", "--", "sh", "-c", script],
        stdout=log, stderr=log, start_new_session=True)
    try:
        port = None
        for _ in range(200):
            log.seek(0)
            m = re.search(r"http://127\.0\.0\.1:(\d+)", log.read())
            if m:
                port = int(m.group(1))
                break
            time.sleep(0.05)
        time.sleep(0.5)
        sse, head = request(port, b"GET /sse HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        while b"session_id=" not in head:
            head += sse.recv(4096)
        sid = re.search(rb"session_id=([0-9a-f-]+)", head).group(1).decode()

        def post(body, read=True):
            raw = (f"POST /messages?session_id={sid} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                   f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body
            return request(port, raw, read)

        init = b'{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2024-11-05","capabilities":{},"clientInfo":{"name":"m","version":"1"}}}'
        post(init)[0].close()
        time.sleep(0.3)
        post(b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"exit","arguments":{"code":1}}}')[0].close()
        time.sleep(1.5)  # the backoff (0.5 s) has passed: the restarted process sleeps
        before = status_kb(p.pid, "VmRSS")
        pad = mib * 1024 * 1024 - 200
        for n in range(count):
            body = ('{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"echo","arguments":{"pad":"' % (n + 2)).encode()
            body += b"x" * (pad - len(body)) + b'"}}}'
            s, _ = post(body, read=False)
            time.sleep(0.3)  # read and waiting
            s.close()
        time.sleep(float(os.environ.get("SETTLE", "3")))
        metrics = request(port, b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")[1].decode()
        left = sum(float(l.split()[-1]) for l in metrics.splitlines()
                   if l.startswith("switchboard_drops_total") and "client_left" in l)
        print(json.dumps({"client_left": left,"binary": os.path.basename(proxy), "posts": count, "mib": mib,
                          "rss_before_kb": before,
                          "rss_after_kb": status_kb(p.pid, "VmRSS"),
                          "hwm_kb": status_kb(p.pid, "VmHWM")}))
    finally:
        # The proxy and its backend (its own process group), and nothing else.
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()


if __name__ == "__main__":
    main()
