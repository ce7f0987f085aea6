"""Sign in to Switchboard by discovery alone with the official Python SDK's OAuth client, then
list and call tools.

Usage: oauth_client.py mcp|sse URL [TOOL [ARGS_JSON]]

URL is the MCP endpoint and nothing else is given: `mcp` uses the Streamable HTTP client
(`streamable_http_client`, URL is .../mcp), `sse` the legacy HTTP+SSE one (`sse_client`, URL is
.../sse). The SDK's `OAuthClientProvider` does the rest, as MCP clients do (MCP authorization,
2025-06-18 / 2025-11-25):
  1. the first request gets 401 with `WWW-Authenticate: Bearer resource_metadata="..."`;
  2. it fetches that protected resource metadata (RFC 9728; without the header it tries
     /.well-known/oauth-protected-resource<path> and then the root), checks that `resource` is
     a prefix of URL and takes the first of `authorization_servers`;
  3. it fetches the authorization server's metadata (RFC 8414 then OpenID discovery);
  4. it registers a public client (RFC 7591, `token_endpoint_auth_method: none`);
  5. it sends the user to the authorization endpoint with PKCE (S256), `state` and
     `resource` = the protected resource; here the "user" is `redirect_handler`, which follows
     that URL with plain HTTP requests (keeping cookies, as a browser does) until the provider
     redirects to our redirect URI, which is never fetched: `callback_handler` hands the SDK
     the `code`, `state` and `iss` found there;
  6. it redeems the code (with the verifier and `resource`) and retries with the token.
Then initialize, tools/list and, when TOOL is given, tools/call TOOL ARGS_JSON (default {}).

Prints one JSON line on stdout: {"transport", "server", "protocol", "tools": [...],
"is_error", "texts": [...], "token": {the access token's JWT header and claims, decoded, never
the token}, "client_id", "authorization": [each URL the browser stand-in visited, up to the
callback, query strings dropped], "requests": ["STATUS METHOD URL" of every request the SDK
made through its HTTP client, query strings dropped]}. Exits non-zero with a traceback on any
failure.
"""

import base64
import json
import sys
from urllib.parse import parse_qs, urljoin, urlsplit, urlunsplit

import anyio
import httpx2
from mcp import ClientSession
from mcp.client.auth import AuthorizationCodeResult, OAuthClientProvider
from mcp.client.sse import sse_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.auth import OAuthClientInformationFull, OAuthClientMetadata, OAuthToken

TIMEOUT_S = 60
# Never fetched: the browser stand-in stops at the redirect to it.
REDIRECT_URI = "http://127.0.0.1:9/callback"
MAX_REDIRECTS = 20


class MemoryStorage:
    """TokenStorage in memory: every run starts from nothing."""

    def __init__(self):
        self.tokens: OAuthToken | None = None
        self.client_info: OAuthClientInformationFull | None = None

    async def get_tokens(self):
        return self.tokens

    async def set_tokens(self, tokens):
        self.tokens = tokens

    async def get_client_info(self):
        return self.client_info

    async def set_client_info(self, client_info):
        self.client_info = client_info


def without_query(url) -> str:
    parts = urlsplit(str(url))
    return urlunsplit(parts._replace(query="", fragment=""))


class Browser:
    """Follows the authorization URL like a browser whose user approves at once: plain GETs,
    cookies kept, redirects followed until the one to REDIRECT_URI, whose parameters are the
    authorization response."""

    def __init__(self):
        self.visited: list[str] = []
        self.result: AuthorizationCodeResult | None = None

    async def redirect_handler(self, authorization_url: str) -> None:
        self.result = None
        url = authorization_url
        async with httpx2.AsyncClient(follow_redirects=False, timeout=10) as http:
            for _ in range(MAX_REDIRECTS):
                if url.startswith(REDIRECT_URI):
                    query = parse_qs(urlsplit(url).query)
                    if "error" in query:
                        raise RuntimeError(f"authorization refused: {query}")
                    self.result = AuthorizationCodeResult(
                        code=query["code"][0],
                        state=query.get("state", [None])[0],
                        iss=query.get("iss", [None])[0],
                    )
                    return
                self.visited.append(without_query(url))
                response = await http.get(url)
                location = response.headers.get("location")
                if response.status_code not in (301, 302, 303, 307, 308) or not location:
                    raise RuntimeError(
                        f"the authorization server answered {response.status_code} at {without_query(url)}"
                        f" instead of redirecting: {response.text[:2000]}"
                    )
                url = urljoin(url, location)
        raise RuntimeError(f"more than {MAX_REDIRECTS} redirects: {self.visited}")

    async def callback_handler(self) -> AuthorizationCodeResult:
        if self.result is None:
            raise RuntimeError("the authorization did not reach the redirect URI")
        return self.result


def jwt_parts(token: str) -> dict:
    def decode(part: str):
        return json.loads(base64.urlsafe_b64decode(part + "=" * (-len(part) % 4)))

    pieces = token.split(".")
    if len(pieces) != 3:
        return {"opaque": True}
    return {"header": decode(pieces[0]), "claims": decode(pieces[1])}


async def run(kind: str, url: str, tool: str | None, args: dict) -> dict:
    storage = MemoryStorage()
    browser = Browser()
    auth = OAuthClientProvider(
        server_url=url,
        client_metadata=OAuthClientMetadata(
            client_name="switchboard-tests python oauth_client",
            redirect_uris=[REDIRECT_URI],
            grant_types=["authorization_code", "refresh_token"],
            response_types=["code"],
            token_endpoint_auth_method="none",
        ),
        storage=storage,
        redirect_handler=browser.redirect_handler,
        callback_handler=browser.callback_handler,
    )
    requests: list[str] = []

    async def log_response(response: httpx2.Response) -> None:
        requests.append(f"{response.status_code} {response.request.method} {without_query(response.request.url)}")

    hooks = {"response": [log_response]}

    def client_factory(headers=None, timeout=None, auth=None):
        return httpx2.AsyncClient(
            headers=headers,
            timeout=timeout or httpx2.Timeout(30, read=TIMEOUT_S),
            auth=auth,
            event_hooks=hooks,
        )

    if kind == "mcp":
        http_client = client_factory(auth=auth)
        transport = streamable_http_client(url, http_client=http_client)
    elif kind == "sse":
        http_client = None
        transport = sse_client(
            url, timeout=10, sse_read_timeout=TIMEOUT_S, httpx_client_factory=client_factory, auth=auth
        )
    else:
        raise SystemExit(f"unknown transport {kind!r} (mcp or sse)")

    try:
        async with transport as streams:
            read, write = streams[0], streams[1]
            async with ClientSession(read, write) as session:
                init = await session.initialize()
                tools = await session.list_tools()
                names = [t.name for t in tools.tools]
                out = {
                    "transport": kind,
                    "server": init.server_info.name,
                    "protocol": init.protocol_version,
                    "tools": names,
                }
                if tool is not None:
                    if tool not in names:
                        raise SystemExit(f"tool {tool!r} not listed: {names}")
                    result = await session.call_tool(tool, args)
                    out["is_error"] = bool(result.is_error)
                    out["texts"] = [c.text for c in result.content if getattr(c, "type", None) == "text"]
    finally:
        if http_client is not None:
            await http_client.aclose()

    tokens = storage.tokens
    out["token"] = jwt_parts(tokens.access_token) if tokens else None
    out["scope"] = tokens.scope if tokens else None
    out["client_id"] = storage.client_info.client_id if storage.client_info else None
    out["authorization"] = browser.visited
    out["requests"] = requests
    return out


async def main(kind, url, tool, args):
    with anyio.fail_after(TIMEOUT_S):
        out = await run(kind, url, tool, args)
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    if len(sys.argv) < 3 or len(sys.argv) > 5:
        raise SystemExit(__doc__)
    tool = sys.argv[3] if len(sys.argv) > 3 else None
    args = json.loads(sys.argv[4]) if len(sys.argv) > 4 else {}
    anyio.run(main, sys.argv[1], sys.argv[2], tool, args)
