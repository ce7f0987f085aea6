// The TypeScript SDK 2.x client (`@modelcontextprotocol/client`: `Client` +
// `StreamableHTTPClientTransport`) in either protocol era, driven by tests/tests/modern.rs
// through a running Switchboard.
//
//   node modern-client.mjs URL SPEC
//
// SPEC is JSON: {"clients": [{"name": "a", "mode": "legacy" | "auto" | "2026-07-28",
// "calls": [{"tool": "echo", "arguments": {...}}, ...]}, ...]}. A mode other than
// `legacy` and `auto` is pinned (`versionNegotiation: {mode: {pin}}`). All clients run at
// once; each connects on URL, lists tools, makes all its calls at once, then closes (a
// 2025 client ends its session with DELETE first). Prints one JSON line on stdout:
//
//   {"clients": [{"name", "mode", "protocolVersion" (the negotiated era), "server",
//     "sessionId", "tools": [names], "results": [each call's result, in SPEC order],
//     "sent": [every JSON-RPC message sent], "received": [every one received],
//     "errors": [what the SDK reported to onerror before closing]}]}
//
// The Rust side checks the pairing of ids on the wire from `sent` and `received` itself.
// Exits 1 (reason on stderr) when anything fails, 2 when it takes longer than 60 s.

import { Client, StreamableHTTPClientTransport } from "@modelcontextprotocol/client";

const [url, specText] = process.argv.slice(2);
if (!url || !specText) {
  console.error("usage: node modern-client.mjs URL SPEC");
  process.exit(1);
}
const spec = JSON.parse(specText);

setTimeout(() => {
  console.error("modern-client: gave up after 60 s");
  process.exit(2);
}, 60_000).unref();

function negotiation(mode) {
  return mode === "legacy" || mode === "auto" ? { mode } : { mode: { pin: mode } };
}

async function runClient({ name, mode, calls }) {
  const sent = [];
  const received = [];
  const errors = [];
  const transport = new StreamableHTTPClientTransport(new URL(url));
    const send = transport.send.bind(transport);
  transport.send = (message, options) => {
    sent.push(message);
    return send(message, options);
  };
  // Whatever handler the client installs (it installs another once the era is known)
  // records first.
  let deliver;
  Object.defineProperty(transport, "onmessage", {
    configurable: true,
    get: () => deliver,
    set: (handler) => {
      deliver =
        handler &&
        ((message, extra) => {
          received.push(message);
          handler(message, extra);
        });
    },
  });
  const client = new Client(
    { name: `switchboard-tests-${name}`, version: "1.0.0" },
    { versionNegotiation: negotiation(mode) },
  );
  let closing = false;
  client.onerror = (e) => closing || errors.push(String(e?.message ?? e));

  await client.connect(transport);
  const { tools } = await client.listTools();
  const results = await Promise.all(
    calls.map(({ tool, arguments: args }) =>
      client.callTool({ name: tool, arguments: args }, { timeout: 30_000 }),
    ),
  );
  const out = {
    name,
    mode,
    protocolVersion: client.getNegotiatedProtocolVersion(),
    server: client.getServerVersion() ?? null,
    sessionId: transport.sessionId ?? null,
    tools: tools.map((t) => t.name),
    results,
  };
  closing = true;
  if (transport.sessionId) {
    await transport.terminateSession();
  }
  await client.close();
  return { ...out, sent, received, errors };
}

try {
  const clients = await Promise.all(spec.clients.map(runClient));
  process.stdout.write(JSON.stringify({ clients }) + "\n");
  process.exit(0);
} catch (e) {
  console.error(`modern-client: ${e?.stack ?? e}`);
  process.exit(1);
}
