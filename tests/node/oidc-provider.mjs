// A real OpenID provider for the OAuth end-to-end suites: npm `oidc-provider` (an
// OpenID-certified implementation, pinned in package-lock.json) on plain http on loopback,
// configured the way an organisation's identity provider serves MCP clients, plus a few
// test-only endpoints. Nothing here is fit for anything but tests. (oidc-provider 9 warns on
// stderr that Node 20 is not a supported runtime; it works on it.)
//
//   node oidc-provider.mjs [--port N] [--jwks-max-age S] [--no-rfc8414] [--account SUB]
//                          [--access-token-ttl S]
//
// It listens on 127.0.0.1:N (N = 0, the default, picks a free port) and prints ONE JSON line on
// stdout once it accepts connections:
//   {"issuer":"http://127.0.0.1:PORT","port":PORT,"kid":"<current signing kid>"}
// Everything else it says goes to stderr. It stops on SIGTERM or SIGINT (the Rust helper,
// tests/src/oidc.rs, kills its process group).
//
// The provider (issuer `http://127.0.0.1:PORT`, no trailing slash):
//   GET  /.well-known/openid-configuration     OpenID discovery, and
//   GET  /.well-known/oauth-authorization-server  RFC 8414 metadata (the same document, both
//        served by oidc-provider), unless --no-rfc8414 is given: then the RFC 8414 location
//        answers 404, as many OpenID providers do, to test the OpenID discovery fallback.
//   GET  /jwks           the key set: the current signing key first, then the previous one
//                        (if any); every GET is counted (see /test/stats). With
//                        --jwks-max-age S it carries `Cache-Control: public, max-age=S`,
//                        otherwise no Cache-Control at all.
//   POST /reg            dynamic client registration (RFC 7591), open: no initial access token.
//                        Public clients (`token_endpoint_auth_method: "none"`) are fine. Scopes
//                        of the registration other than `openid` and `offline_access` are dropped
//                        from it (oidc-provider would refuse them; resource scopes are free text
//                        here and are granted at /auth all the same).
//   GET  /auth           authorization endpoint: response_type=code, PKCE (S256) REQUIRED for
//                        every client, `resource` (RFC 8707) required to get a JWT. It redirects
//                        to /interaction/UID, which approves at once (no login page, no consent
//                        page): the account is `login_hint` if given, else --account (default
//                        "alice"), every requested scope is granted for every requested resource.
//                        The redirect back to /auth/UID needs the cookies set on the way
//                        (`_interaction`, `_interaction_resume`, `_session`), as a browser
//                        would keep them; then it redirects to the client's redirect_uri with
//                        `code`, `state` and `iss` (RFC 9207).
//   POST /token          authorization_code (+ code_verifier), refresh_token, client_credentials.
//                        An access token for resource R is a JWT (`typ: at+jwt`, RS256, `kid`
//                        in the header) with `iss` = the issuer, `aud` = R verbatim, `sub`,
//                        `client_id`, `scope` (the granted scopes for R, space-separated), `iat`,
//                        `exp`, `jti`. Any scope a client asks for is granted (scopes are free
//                        text; `openid` and `offline_access` never reach an access token for R).
//
// Minting a token without a browser-like flow: the confidential client
//   client_id=switchboard-tests  client_secret=switchboard-tests-secret
//   (token_endpoint_auth_method client_secret_post, grant client_credentials)
//   curl -s http://127.0.0.1:PORT/token -d grant_type=client_credentials \
//        -d client_id=switchboard-tests -d client_secret=switchboard-tests-secret \
//        -d resource=http://127.0.0.1:8080/ -d 'scope=mcp:tools mcp:admin'
// answers {"access_token":"<JWT>","expires_in":...,"token_type":"Bearer","scope":"..."}.
// Test-only extra form fields of that grant (for this client only):
//   sub=bob      the token's `sub` (default: the client id, `switchboard-tests`)
//   ttl=5        the token's lifetime in seconds (default: --access-token-ttl)
//   claims={..}  a JSON object merged into the token's payload (e.g. {"scp":["a","b"]})
// A token for ANOTHER resource (to test refusal) is the same request with another `resource`.
//
// Test-only endpoints (loopback, no auth):
//   POST /test/rotate         rotates the signing key: a new RSA key with a new kid signs every
//                             token from now on; /jwks lists it first, then the previous key
//                             (?keep_old=0 drops the previous key). Answers {"kid":NEW,"kids":[..]}.
//                             SIGUSR2 does the same.
//   GET  /test/stats          {"jwks_fetches":N,"discovery_fetches":N,"registrations":N,
//                              "authorizations":N,"token_requests":N,"kid":CURRENT,"kids":[..],
//                              "outage":bool,"account":SUB}
//   POST /test/outage?on=1    every endpoint but /test/* answers 503 until ?on=0 (an identity
//                             provider that is down without its port going away).
//   POST /test/account?sub=X  the account later sign-ins approve (default --account).

import { createServer } from 'node:http';
import { generateKeyPairSync, randomBytes } from 'node:crypto';

// oidc-provider prints its notices with console.info (stdout): keep stdout for the one JSON line.
console.info = (...args) => console.error(...args);
const { default: Provider } = await import('oidc-provider');

const TEST_CLIENT_ID = 'switchboard-tests';
const TEST_CLIENT_SECRET = 'switchboard-tests-secret';
// Scopes that belong to OpenID Connect itself, never to a resource server.
const OIDC_SCOPES = new Set(['openid', 'offline_access', 'profile', 'email', 'address', 'phone']);
// The scopes the provider lists (`scopes_supported`); resource scopes are free text (below).
const SUPPORTED_SCOPES = ['openid', 'offline_access'];

function parseArgs(argv) {
  const opts = {
    port: 0, jwksMaxAge: undefined, rfc8414: true, account: 'alice', accessTokenTtl: 3600,
  };
  for (let i = 0; i < argv.length; i += 1) {
    const a = argv[i];
    const value = () => {
      i += 1;
      if (i >= argv.length) throw new Error(`${a} needs a value`);
      return argv[i];
    };
    switch (a) {
      case '--port': opts.port = Number(value()); break;
      case '--jwks-max-age': opts.jwksMaxAge = Number(value()); break;
      case '--no-rfc8414': opts.rfc8414 = false; break;
      case '--account': opts.account = value(); break;
      case '--access-token-ttl': opts.accessTokenTtl = Number(value()); break;
      default:
        if (/^\d+$/.test(a)) opts.port = Number(a);
        else throw new Error(`unknown argument ${a}`);
    }
  }
  return opts;
}

const opts = parseArgs(process.argv.slice(2));

const stats = {
  jwks_fetches: 0,
  discovery_fetches: 0,
  registrations: 0,
  authorizations: 0,
  token_requests: 0,
};
let outage = false;
let account = opts.account;
let keyCounter = 0;
const cookieKey = randomBytes(32).toString('base64url');

// A fresh RS256 signing key: a private JWK with a kid that is new even across restarts.
function newSigningKey() {
  keyCounter += 1;
  const { privateKey } = generateKeyPairSync('rsa', { modulusLength: 2048 });
  const jwk = privateKey.export({ format: 'jwk' });
  return {
    ...jwk, kid: `sb-${keyCounter}-${randomBytes(4).toString('hex')}`, alg: 'RS256', use: 'sig',
  };
}

function publicJwk({
  kty, n, e, kid, alg, use,
}) {
  return {
    kty, n, e, kid, alg, use,
  };
}

// Newest first: oidc-provider signs with the first key that fits (a stable sort).
let keys = [newSigningKey()];

// Every scope of a request (and of the code or refresh token being redeemed) that is not an
// OpenID one is a scope of the resource server: the test provider grants whatever is asked.
function resourceScopes(ctx) {
  const scopes = new Set();
  const add = (s) => {
    for (const x of (s || '').split(' ')) if (x && !OIDC_SCOPES.has(x)) scopes.add(x);
  };
  add(ctx?.oidc?.params?.scope);
  add(ctx?.oidc?.entities?.AuthorizationCode?.scope);
  add(ctx?.oidc?.entities?.RefreshToken?.scope);
  add(ctx?.oidc?.body?.scope);
  return [...scopes].join(' ');
}

function isTestClientGrant(ctx, token) {
  return token.kind === 'ClientCredentials' && token.clientId === TEST_CLIENT_ID && ctx?.oidc?.body;
}

function makeProvider(issuer) {
  const configuration = {
    clients: [{
      client_id: TEST_CLIENT_ID,
      client_secret: TEST_CLIENT_SECRET,
      grant_types: ['client_credentials'],
      response_types: [],
      redirect_uris: [],
      token_endpoint_auth_method: 'client_secret_post',
    }],
    jwks: { keys },
    cookies: { keys: [cookieKey] },
    pkce: { required: () => true },
    scopes: [...SUPPORTED_SCOPES],
    features: {
      devInteractions: { enabled: false },
      registration: { enabled: true, initialAccessToken: false },
      clientCredentials: { enabled: true },
      introspection: { enabled: true },
      revocation: { enabled: true },
      resourceIndicators: {
        enabled: true,
        defaultResource: async (_ctx, _client, oneOf) => oneOf,
        useGrantedResource: async () => true,
        getResourceServerInfo: async (ctx, resourceIndicator) => ({
          scope: resourceScopes(ctx),
          audience: resourceIndicator,
          accessTokenFormat: 'jwt',
          jwt: { sign: { alg: 'RS256' } },
        }),
      },
    },
    formats: {
      customizers: {
        async jwt(ctx, token, jwt) {
          if (!isTestClientGrant(ctx, token)) return;
          const { sub, claims } = ctx.oidc.body;
          if (typeof sub === 'string' && sub) jwt.payload.sub = sub;
          if (typeof claims === 'string' && claims) Object.assign(jwt.payload, JSON.parse(claims));
        },
      },
    },
    ttl: {
      AccessToken: () => opts.accessTokenTtl,
      AuthorizationCode: () => 60,
      ClientCredentials: (ctx, token) => {
        const ttl = isTestClientGrant(ctx, token) ? Number(ctx.oidc.body.ttl) : NaN;
        return Number.isInteger(ttl) && ttl > 0 ? ttl : opts.accessTokenTtl;
      },
      Grant: () => 14 * 24 * 3600,
      IdToken: () => 3600,
      Interaction: () => 600,
      RefreshToken: () => 14 * 24 * 3600,
      Session: () => 14 * 24 * 3600,
      DeviceCode: () => 600,
      BackchannelAuthenticationRequest: () => 600,
      PreAuthorizedCode: () => 600,
    },
    findAccount: async (_ctx, sub) => ({ accountId: sub, claims: async () => ({ sub }) }),
    clientBasedCORS: () => true,
    renderError: async (ctx, out) => {
      ctx.type = 'json';
      ctx.body = out;
    },
  };
  const provider = new Provider(issuer, configuration);
  provider.on('server_error', (_ctx, err) => console.error('oidc-provider server_error:', err));
  return provider;
}

// Approves at once: signs `account` in and grants every requested scope for every requested
// resource, in one step, then sends the user agent back to /auth/UID.
async function approve(provider, req, res) {
  const details = await provider.interactionDetails(req, res);
  const { params, session } = details;
  const accountId = session?.accountId
    ?? (typeof params.login_hint === 'string' && params.login_hint ? params.login_hint : account);
  const grant = details.grantId
    ? await provider.Grant.find(details.grantId)
    : new provider.Grant({ accountId, clientId: params.client_id });
  const scope = typeof params.scope === 'string' ? params.scope : '';
  if (scope) grant.addOIDCScope(scope);
  const missing = details.prompt?.details?.missingOIDCClaims;
  if (missing) grant.addOIDCClaims(missing);
  const resources = params.resource === undefined ? []
    : [].concat(params.resource);
  for (const r of resources) grant.addResourceScope(r, scope);
  for (const [r, s] of Object.entries(details.prompt?.details?.missingResourceScopes ?? {})) {
    grant.addResourceScope(r, s.join(' '));
  }
  const grantId = await grant.save();
  const result = { login: { accountId }, consent: { grantId } };
  await provider.interactionFinished(req, res, result, { mergeWithLastSubmission: true });
}

// oidc-provider refuses a registration whose `scope` names a scope it does not list, but
// resource scopes are free text here (any the proxy under test offers), and MCP clients register
// with the scopes they are about to ask for: drop the unlisted ones from the registration (the
// client still asks for them at /auth, and gets them). oidc-provider takes a body read
// beforehand from `req.body` (it warns once on stderr that it did).
async function dropUnlistedScopes(req) {
  if (!/^application\/json\b/.test(req.headers['content-type'] ?? '')) return;
  const chunks = [];
  for await (const chunk of req) chunks.push(chunk);
  const text = Buffer.concat(chunks).toString('utf8');
  let body;
  try {
    body = JSON.parse(text);
  } catch {
    req.body = text;
    return;
  }
  if (body && typeof body.scope === 'string') {
    const kept = body.scope.split(' ').filter((s) => SUPPORTED_SCOPES.includes(s));
    if (kept.length) body.scope = kept.join(' ');
    else delete body.scope;
  }
  req.body = body;
}

function sendJson(res, status, body, headers = {}) {
  const text = JSON.stringify(body);
  res.writeHead(status, {
    'Content-Type': 'application/json', 'Content-Length': Buffer.byteLength(text), ...headers,
  });
  res.end(text);
}

function rotate(keepOld = true) {
  keys = keepOld ? [newSigningKey(), keys[0]] : [newSigningKey()];
  provider = makeProvider(issuer);
  handler = provider.callback();
  console.error(`oidc-provider test: rotated; signing kid ${keys[0].kid}`);
  return { kid: keys[0].kid, kids: keys.map((k) => k.kid) };
}

let issuer;
let provider;
let handler;

const server = createServer(async (req, res) => {
  try {
    const url = new URL(req.url, 'http://127.0.0.1');
    const path = url.pathname;
    if (path.startsWith('/test/')) {
      if (path === '/test/stats' && req.method === 'GET') {
        return sendJson(res, 200, {
          ...stats, kid: keys[0].kid, kids: keys.map((k) => k.kid), outage, account,
        });
      }
      if (path === '/test/rotate' && req.method === 'POST') {
        return sendJson(res, 200, rotate(url.searchParams.get('keep_old') !== '0'));
      }
      if (path === '/test/outage' && req.method === 'POST') {
        outage = url.searchParams.get('on') !== '0';
        return sendJson(res, 200, { outage });
      }
      if (path === '/test/account' && req.method === 'POST' && url.searchParams.get('sub')) {
        account = url.searchParams.get('sub');
        return sendJson(res, 200, { account });
      }
      return sendJson(res, 404, { error: 'not_found' });
    }
    if (outage) {
      return sendJson(res, 503, { error: 'temporarily_unavailable' }, { 'Retry-After': '1' });
    }
    if (path === '/jwks' && req.method === 'GET') {
      stats.jwks_fetches += 1;
      const headers = opts.jwksMaxAge === undefined ? {}
        : { 'Cache-Control': `public, max-age=${opts.jwksMaxAge}` };
      return sendJson(res, 200, { keys: keys.map(publicJwk) }, headers);
    }
    if (path.startsWith('/.well-known/oauth-authorization-server')) {
      if (!opts.rfc8414) return sendJson(res, 404, { error: 'not_found' });
      stats.discovery_fetches += 1;
    }
    if (path.startsWith('/.well-known/openid-configuration')) stats.discovery_fetches += 1;
    if (path === '/reg' && req.method === 'POST') {
      stats.registrations += 1;
      await dropUnlistedScopes(req);
    }
    if (path === '/auth') stats.authorizations += 1;
    if (path === '/token' && req.method === 'POST') stats.token_requests += 1;
    const interaction = /^\/interaction\/[^/]+$/.exec(path);
    if (interaction && req.method === 'GET') return await approve(provider, req, res);
    return handler(req, res);
  } catch (err) {
    console.error('oidc-provider test: error:', err);
    if (!res.headersSent) return sendJson(res, 500, { error: 'server_error', error_description: String(err) });
    res.destroy();
  }
  return undefined;
});

server.listen(opts.port, '127.0.0.1', () => {
  const { port } = server.address();
  issuer = `http://127.0.0.1:${port}`;
  provider = makeProvider(issuer);
  handler = provider.callback();
  process.stdout.write(`${JSON.stringify({ issuer, port, kid: keys[0].kid })}\n`);
});

process.on('SIGUSR2', () => rotate(true));
for (const sig of ['SIGTERM', 'SIGINT']) {
  process.on(sig, () => {
    server.close();
    process.exit(0);
  });
}
