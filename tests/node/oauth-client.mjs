// The official TypeScript SDK client signs in to Switchboard by discovery alone (MCP
// authorization, 2025-06-18 / 2025-11-25), then lists and calls tools.
//
//   node oauth-client.mjs URL [TOOL [ARGS_JSON]]
//
// URL is the Streamable HTTP endpoint (.../mcp) and nothing else is given.
// `StreamableHTTPClientTransport` with an `authProvider` (the SDK's `OAuthClientProvider`
// interface, kept in memory) does what MCP clients do:
//   1. the first POST gets 401 with `WWW-Authenticate: Bearer resource_metadata="..."`;
//   2. it fetches that protected resource metadata (RFC 9728), checks `resource` against URL
//      and takes the first of `authorization_servers`;
//   3. it fetches the authorization server's metadata (RFC 8414, then OpenID discovery);
//   4. it registers a public client (RFC 7591, `token_endpoint_auth_method: none`);
//   5. it calls `redirectToAuthorization` with the authorization URL (PKCE S256, `resource`,
//      `state`), and `connect` fails with UnauthorizedError. Here a browser stand-in follows
//      that URL with plain GETs (keeping cookies, as a browser does) until the provider
//      redirects to our redirect URI (never fetched), and takes the `code` found there;
//   6. `transport.finishAuth(code)` redeems it (with the verifier and `resource`); a new
//      transport then connects with the token.
// Then tools/list and, when TOOL is given, tools/call TOOL ARGS_JSON (default {}).
//
// Prints one JSON line on stdout: {"server", "protocolVersion", "tools": [names], "result"
// (of the call, if any), "token": {the access token's JWT header and claims, decoded, never the
// token}, "scope", "clientId", "authorization": [each URL the browser stand-in visited, query
// strings dropped], "requests": ["STATUS METHOD URL" of every request the SDK made, query
// strings dropped]}. Exits 1 (reason on stderr) when anything fails, 2 after 60 s.

import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { UnauthorizedError } from "@modelcontextprotocol/sdk/client/auth.js";

const [url, tool, argsText] = process.argv.slice(2);
if (!url) {
  console.error("usage: node oauth-client.mjs URL [TOOL [ARGS_JSON]]");
  process.exit(1);
}
const args = argsText ? JSON.parse(argsText) : {};

setTimeout(() => {
  console.error("oauth-client: gave up after 60 s");
  process.exit(2);
}, 60_000).unref();

// Never fetched: the browser stand-in stops at the redirect to it.
const REDIRECT_URI = "http://127.0.0.1:9/callback";
const MAX_REDIRECTS = 20;

function withoutQuery(u) {
  const parsed = new URL(String(u));
  parsed.search = "";
  parsed.hash = "";
  return parsed.href;
}

function jwtParts(token) {
  const pieces = token.split(".");
  if (pieces.length !== 3) return { opaque: true };
  const decode = (p) => JSON.parse(Buffer.from(p, "base64url").toString("utf8"));
  return { header: decode(pieces[0]), claims: decode(pieces[1]) };
}

// A browser whose user approves at once: GETs with cookies kept, redirects followed until the
// one to REDIRECT_URI, whose query is the authorization response.
class Browser {
  visited = [];
  cookies = new Map();

  async authorize(authorizationUrl) {
    let next = String(authorizationUrl);
    for (let i = 0; i < MAX_REDIRECTS; i += 1) {
      if (next.startsWith(REDIRECT_URI)) {
        const query = new URL(next).searchParams;
        if (query.get("error")) {
          throw new Error(`authorization refused: ${query.get("error")}: ${query.get("error_description")}`);
        }
        return { code: query.get("code"), state: query.get("state"), iss: query.get("iss") };
      }
      this.visited.push(withoutQuery(next));
      const cookie = [...this.cookies].map(([k, v]) => `${k}=${v}`).join("; ");
      const response = await fetch(next, { redirect: "manual", headers: cookie ? { cookie } : {} });
      for (const line of response.headers.getSetCookie()) {
        const [pair] = line.split(";");
        const eq = pair.indexOf("=");
        if (eq > 0) this.cookies.set(pair.slice(0, eq).trim(), pair.slice(eq + 1).trim());
      }
      const location = response.headers.get("location");
      if (![301, 302, 303, 307, 308].includes(response.status) || !location) {
        throw new Error(
          `the authorization server answered ${response.status} at ${withoutQuery(next)} instead of redirecting: ${(await response.text()).slice(0, 2000)}`,
        );
      }
      next = new URL(location, next).href;
    }
    throw new Error(`more than ${MAX_REDIRECTS} redirects: ${this.visited.join(" ")}`);
  }
}

// The SDK's OAuthClientProvider interface, in memory: every run starts from nothing.
class MemoryProvider {
  constructor(browser) {
    this.browser = browser;
    this.pending = undefined;
    this._clientInformation = undefined;
    this._tokens = undefined;
    this._codeVerifier = undefined;
    this._discovery = undefined;
  }

  get redirectUrl() {
    return REDIRECT_URI;
  }

  get clientMetadata() {
    return {
      client_name: "switchboard-tests typescript oauth-client",
      redirect_uris: [REDIRECT_URI],
      grant_types: ["authorization_code", "refresh_token"],
      response_types: ["code"],
      token_endpoint_auth_method: "none",
    };
  }

  clientInformation() {
    return this._clientInformation;
  }

  saveClientInformation(info) {
    this._clientInformation = info;
  }

  tokens() {
    return this._tokens;
  }

  saveTokens(tokens) {
    this._tokens = tokens;
  }

  redirectToAuthorization(authorizationUrl) {
    // `connect` fails with UnauthorizedError right after this returns; the code is awaited there.
    this.pending = this.browser.authorize(authorizationUrl);
    this.pending.catch(() => {});
  }

  saveCodeVerifier(verifier) {
    this._codeVerifier = verifier;
  }

  codeVerifier() {
    if (!this._codeVerifier) throw new Error("no code verifier saved");
    return this._codeVerifier;
  }

  saveDiscoveryState(state) {
    this._discovery = state;
  }

  discoveryState() {
    return this._discovery;
  }

  invalidateCredentials(scope) {
    if (scope === "all" || scope === "client") this._clientInformation = undefined;
    if (scope === "all" || scope === "tokens") this._tokens = undefined;
    if (scope === "all" || scope === "verifier") this._codeVerifier = undefined;
    if (scope === "all" || scope === "discovery") this._discovery = undefined;
  }
}

const requests = [];
const loggingFetch = async (input, init) => {
  const response = await fetch(input, init);
  const method = init?.method ?? (input instanceof Request ? input.method : "GET");
  requests.push(`${response.status} ${method} ${withoutQuery(input instanceof Request ? input.url : input)}`);
  return response;
};

const browser = new Browser();
const provider = new MemoryProvider(browser);

function transport() {
  return new StreamableHTTPClientTransport(new URL(url), { authProvider: provider, fetch: loggingFetch });
}

async function main() {
  let client = new Client({ name: "switchboard-tests-oauth", version: "1.0.0" });
  let t = transport();
  try {
    await client.connect(t);
  } catch (e) {
    if (!(e instanceof UnauthorizedError) || !provider.pending) throw e;
    const { code } = await provider.pending;
    await t.finishAuth(code);
    await client.close().catch(() => {});
    client = new Client({ name: "switchboard-tests-oauth", version: "1.0.0" });
    t = transport();
    await client.connect(t);
  }
  const out = {
    server: client.getServerVersion()?.name,
    protocolVersion: t.protocolVersion,
  };
  const listed = await client.listTools();
  out.tools = listed.tools.map((x) => x.name);
  if (tool) {
    if (!out.tools.includes(tool)) throw new Error(`tool ${tool} not listed: ${out.tools}`);
    out.result = await client.callTool({ name: tool, arguments: args });
  }
  await t.terminateSession().catch(() => {});
  await client.close();
  const tokens = provider.tokens();
  out.token = tokens ? jwtParts(tokens.access_token) : null;
  out.scope = tokens?.scope ?? null;
  out.clientId = provider.clientInformation()?.client_id ?? null;
  out.authorization = browser.visited;
  out.requests = requests;
  process.stdout.write(`${JSON.stringify(out)}\n`);
}

main().then(
  () => process.exit(0),
  (e) => {
    console.error("oauth-client:", e?.stack ?? e);
    process.exit(1);
  },
);
