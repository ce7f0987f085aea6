// The official TypeScript SDK client (`Client` + `StreamableHTTPClientTransport`) driven by
// tests/tests/ts_sdk.rs through a running Switchboard.
//
//   node streamable-client.mjs URL SPEC
//
// SPEC is JSON: {"clients": [{"name": "a", "calls": [{"tool": "echo", "arguments": {...},
// "progress": false}, ...]}, ...]}. All clients run at once; each connects (initialize and
// initialized on URL), lists tools, makes all its calls at once, then ends its session with
// DELETE. Prints one JSON line on stdout:
//
//   {"clients": [{"name", "server", "protocolVersion", "sessionId", "tools": [names],
//     "results": [{"result", "progress": [numbers]} in SPEC order],
//     "sent": [every JSON-RPC message sent], "received": [every one received],
//     "errors": [what the SDK reported to onerror before the DELETE],
//     "teardownErrors": [what it reported after]}]}
//
// The Rust side checks the pairing of ids on the wire from `sent` and `received` itself.
// Exits 1 (reason on stderr) when anything fails, 2 when it takes longer than 60 s.

import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

const [url, specText] = process.argv.slice(2);
if (!url || !specText) {
  console.error("usage: node streamable-client.mjs URL SPEC");
  process.exit(1);
}
const spec = JSON.parse(specText);

setTimeout(() => {
  console.error("streamable-client: gave up after 60 s");
  process.exit(2);
}, 60_000).unref();

async function runClient({ name, calls }) {
  const sent = [];
  const received = [];
  const errors = [];
  const transport = new StreamableHTTPClientTransport(new URL(url));
  // Record the wire: Protocol.connect sets onmessage before it starts the transport.
  const send = transport.send.bind(transport);
  transport.send = (message, options) => {
    sent.push(message);
    return send(message, options);
  };
  const start = transport.start.bind(transport);
  transport.start = () => {
    const deliver = transport.onmessage;
    transport.onmessage = (message, extra) => {
      received.push(message);
      deliver?.(message, extra);
    };
    return start();
  };
  const client = new Client({ name: `switchboard-tests-${name}`, version: "1.0.0" });
  // What the SDK reports while the client works; ending the session aborts its GET
  // stream, which it reports too, so that part is kept apart.
  const teardownErrors = [];
  let tearingDown = false;
  client.onerror = (e) => (tearingDown ? teardownErrors : errors).push(String(e?.message ?? e));

  await client.connect(transport);
  const { tools } = await client.listTools();
  const results = await Promise.all(
    calls.map(async ({ tool, arguments: args, progress }) => {
      const steps = [];
      const options = { timeout: 30_000 };
      if (progress) {
        options.onprogress = (p) => steps.push(p.progress);
      }
      const result = await client.callTool({ name: tool, arguments: args }, undefined, options);
      return { result, progress: steps };
    }),
  );
  const out = {
    name,
    server: client.getServerVersion(),
    protocolVersion: transport.protocolVersion,
    sessionId: transport.sessionId,
    tools: tools.map((t) => t.name),
    results,
  };
  tearingDown = true;
  await transport.terminateSession();
  await client.close();
  return { ...out, sent, received, errors, teardownErrors };
}

try {
  const clients = await Promise.all(spec.clients.map(runClient));
  process.stdout.write(JSON.stringify({ clients }) + "\n");
  process.exit(0);
} catch (e) {
  console.error(`streamable-client: ${e?.stack ?? e}`);
  process.exit(1);
}
