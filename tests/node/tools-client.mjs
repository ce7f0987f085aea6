// The TypeScript SDK 2.x client (`@modelcontextprotocol/client`) listing and calling tools
// through a running Switchboard, for tests/tests/tools.rs.
//
//   node tools-client.mjs URL SPEC
//
// SPEC is JSON: {"modes": ["2026-07-28" | "legacy" | "auto", ...], "calls": [{"tool",
// "arguments"}, ...]}. One client per mode, one after another: it connects on URL (a mode
// other than `legacy` and `auto` is pinned), lists every tool (following `nextCursor`), makes
// each call in order, then closes (a 2025 client ends its session with DELETE first). Prints
// one JSON line on stdout:
//
//   {"clients": [{"mode", "protocolVersion", "tools": [each tool as listed],
//     "calls": [{"tool", "ok", "texts"} | {"tool", "ok": false, "code", "message"}]}]}
//
// where a call answered with a JSON-RPC error has its code and message. Exits 1 (reason on
// stderr) when anything else fails, 2 when it takes longer than 60 s.

import { Client, StreamableHTTPClientTransport } from "@modelcontextprotocol/client";

const [url, specText] = process.argv.slice(2);
if (!url || !specText) {
  console.error("usage: node tools-client.mjs URL SPEC");
  process.exit(1);
}
const spec = JSON.parse(specText);

setTimeout(() => {
  console.error("tools-client: gave up after 60 s");
  process.exit(2);
}, 60_000).unref();

function negotiation(mode) {
  return mode === "legacy" || mode === "auto" ? { mode } : { mode: { pin: mode } };
}

async function runClient(mode) {
  const transport = new StreamableHTTPClientTransport(new URL(url));
  const client = new Client(
    { name: "switchboard-tests-tools", version: "1.0.0" },
    { versionNegotiation: negotiation(mode) },
  );
  await client.connect(transport);
  const tools = [];
  let cursor;
  for (let page = 0; page < 10; page++) {
    const listed = await client.listTools(cursor ? { cursor } : undefined);
    tools.push(...listed.tools);
    cursor = listed.nextCursor;
    if (!cursor) break;
  }
  const calls = [];
  for (const { tool, arguments: args } of spec.calls) {
    try {
      const result = await client.callTool({ name: tool, arguments: args }, { timeout: 30_000 });
      const texts = (result.content ?? []).filter((c) => c.type === "text").map((c) => c.text);
      calls.push({ tool, ok: !result.isError, texts });
    } catch (e) {
      if (typeof e?.code !== "number") throw e;
      calls.push({ tool, ok: false, code: e.code, message: e.message });
    }
  }
  const out = { mode, protocolVersion: client.getNegotiatedProtocolVersion(), tools, calls };
  if (transport.sessionId) {
    await transport.terminateSession();
  }
  await client.close();
  return out;
}

try {
  const clients = [];
  for (const mode of spec.modes) {
    clients.push(await runClient(mode));
  }
  process.stdout.write(JSON.stringify({ clients }) + "\n");
  process.exit(0);
} catch (e) {
  console.error(`tools-client: ${e?.stack ?? e}`);
  process.exit(1);
}
