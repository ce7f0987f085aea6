// The official TypeScript SDK client (`Client` + `StreamableHTTPClientTransport`) keeps its
// session while the backend behind Switchboard is killed and restarted; driven by
// tests/tests/ts_sdk.rs against `test-backend` (started with TEST_BACKEND_RECORD=RECORD).
//
//   node restart-client.mjs URL RECORD URI CLIENTS
//
// URL is the proxy's base (`http://127.0.0.1:PORT`). CLIENTS clients run at once; client N:
//   1. connects to URL/mcp (initialize, initialized), lists tools, subscribes to URI/ts-N
//      (`resources/subscribe`), calls `touch` on it and waits for `resources/updated`;
//   2. starts `delay {ms: 60000}`, still in flight when the backend dies, and waits until
//      the backend has read it (its marker is in RECORD).
// Once every client is there, the script reads the backend's pid from URL/health and kills
// it (SIGKILL). Then each client, on the session it has (it never connects again):
//   3. collects the outcome of the call in flight;
//   4. calls `echo` (answered by the restarted backend);
//   5. calls `touch` again and waits for `resources/updated` for its uri (only a
//      subscription the proxy renewed reaches the new process);
//   6. waits for the three `notifications/*/list_changed`.
// Every wait is bounded (30 s); a missed one fails the script with what the client had seen.
// Prints one JSON line on stdout: {"pids": [killed, after], "clients": [{"name", "uri",
// "sessionIds": [every Mcp-Session-Id its requests carried], "sent": [every JSON-RPC method
// it sent, in order], "inFlight": {"code", "message"} or {"result"}, "echo": args echoed
// after the restart, "touched": [touch results], "before": [notifications received before
// the kill], "after": [those after it], "errors": [what the SDK reported to onerror]}]},
// a notification written as its method, followed by ` URI` for `resources/updated`.
// Exits 1 (reason on stderr) when anything fails, 2 when it takes longer than 150 s.

import { readFileSync } from "node:fs";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

const WAIT_MS = 30_000;
const IN_FLIGHT_MS = 60_000;
const UPDATED = "notifications/resources/updated";
const LIST_CHANGED = ["tools", "resources", "prompts"].map((w) => `notifications/${w}/list_changed`);

const [base, record, uriPrefix, count] = process.argv.slice(2);
if (!base || !record || !uriPrefix || !count) {
  console.error("usage: node restart-client.mjs URL RECORD URI CLIENTS");
  process.exit(1);
}

setTimeout(() => {
  console.error("restart-client: gave up after 150 s");
  process.exit(2);
}, 150_000).unref();

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

/** Polls `check` until it returns something other than undefined, for at most WAIT_MS. */
async function until(what, check) {
  const deadline = Date.now() + WAIT_MS;
  for (;;) {
    const got = await check();
    if (got !== undefined) return got;
    if (Date.now() > deadline) throw new Error(`${what}: not within ${WAIT_MS} ms`);
    await sleep(50);
  }
}

async function backendPid() {
  return until("a running backend in /health", async () => {
    const health = await (await fetch(`${base}/health`)).json();
    return health?.backend?.running && health.backend.pid ? health.backend.pid : undefined;
  });
}

function texts(result) {
  return result.content.filter((c) => c.type === "text").map((c) => c.text);
}

/** A barrier: `wait()` resolves once `open()` was called. */
function gate() {
  let open;
  const opened = new Promise((resolve) => (open = resolve));
  return { open, wait: () => opened };
}

async function runClient(index, ready, killed) {
  const name = `ts-${index}`;
  const uri = `${uriPrefix}/${name}`;
  const updated = `${UPDATED} ${uri}`;
  const sessionIds = [];
  const sent = [];
  const heard = [];
  const errors = [];
  const recordingFetch = (url, init) => {
    const sid = new Headers(init?.headers).get("mcp-session-id");
    if (sid && !sessionIds.includes(sid)) sessionIds.push(sid);
    return fetch(url, init);
  };
  const transport = new StreamableHTTPClientTransport(new URL(`${base}/mcp`), {
    fetch: recordingFetch,
  });
  const send = transport.send.bind(transport);
  transport.send = (message, options) => {
    if (message.method) sent.push(message.method);
    return send(message, options);
  };
  const start = transport.start.bind(transport);
  transport.start = () => {
    const deliver = transport.onmessage;
    transport.onmessage = (message, extra) => {
      if (message.method && message.id === undefined) {
        heard.push(message.method === UPDATED ? `${UPDATED} ${message.params?.uri}` : message.method);
      }
      deliver?.(message, extra);
    };
    return start();
  };
  const client = new Client({ name: `switchboard-tests-${name}`, version: "1.0.0" });
  let tearingDown = false;
  client.onerror = (e) => {
    if (!tearingDown) errors.push(String(e?.message ?? e));
  };
  const hear = (what, pred) =>
    until(`${name}: ${what} (heard so far: ${JSON.stringify(heard)})`, () => (pred() ? true : undefined));
  const options = { timeout: 2 * IN_FLIGHT_MS };

  await client.connect(transport);
  const { tools } = await client.listTools();
  for (const tool of ["touch", "delay", "echo"]) {
    if (!tools.some((t) => t.name === tool)) throw new Error(`${name}: tool ${tool} not listed`);
  }
  await client.subscribeResource({ uri });
  const touched = [JSON.parse(texts(await client.callTool({ name: "touch", arguments: { uri } }))[0])];
  await hear("resources/updated before the kill", () => heard.includes(updated));

  const marker = `in-flight-${name}`;
  const inFlight = client
    .callTool({ name: "delay", arguments: { ms: IN_FLIGHT_MS, marker } }, undefined, options)
    .then(
      (r) => ({ result: texts(r) }),
      (e) => ({ code: e?.code, message: String(e?.message ?? e) }),
    );
  await until(`${name}: the call in flight reaching the backend`, () => {
    try {
      return readFileSync(record, "utf8").includes(marker) ? true : undefined;
    } catch {
      return undefined;
    }
  });
  // Taken before the kill (the script kills once every client is ready).
  const killSeen = heard.length;
  ready.open();
  await killed.wait();
  const outcome = await Promise.race([inFlight, sleep(WAIT_MS).then(() => undefined)]);
  if (outcome === undefined) {
    throw new Error(`${name}: the call in flight got no answer within ${WAIT_MS} ms of the kill`);
  }

  const args = { after: "restart", client: name };
  const echoed = texts(await client.callTool({ name: "echo", arguments: args }, undefined, options));
  touched.push(JSON.parse(texts(await client.callTool({ name: "touch", arguments: { uri } }, undefined, options))[0]));
  await hear(`resources/updated for ${uri} after the restart`, () => heard.slice(killSeen).includes(updated));
  await hear("the three list_changed after the restart", () =>
    LIST_CHANGED.every((m) => heard.slice(killSeen).includes(m)),
  );
  const out = {
    name,
    uri,
    sessionId: transport.sessionId,
    sessionIds,
    sent,
    inFlight: outcome,
    echo: JSON.parse(echoed[0]),
    touched,
    before: heard.slice(0, killSeen),
    after: heard.slice(killSeen),
    errors,
  };
  tearingDown = true;
  await transport.terminateSession();
  await client.close();
  return out;
}

try {
  const n = Number(count);
  const readies = Array.from({ length: n }, gate);
  const killed = gate();
  const running = readies.map((ready, i) => runClient(i, ready, killed));
  // A client that fails before it is ready must fail the script, not leave it waiting.
  await Promise.race([Promise.all(readies.map((r) => r.wait())), Promise.all(running)]);
  const pid = await backendPid();
  process.kill(pid, "SIGKILL");
  killed.open();
  const clients = await Promise.all(running);
  const after = await until("a new backend process", async () => {
    const now = await backendPid();
    return now !== pid ? now : undefined;
  });
  process.stdout.write(JSON.stringify({ pids: [pid, after], clients }) + "\n");
  process.exit(0);
} catch (e) {
  console.error(`restart-client: ${e?.stack ?? e}`);
  process.exit(1);
}
