#!/usr/bin/env python3
"""A streamable HTTP MCP server behind OAuth, with its authorization server, for the
gateway's OAuth tests (tests/oauth.rs). Standard library only.

    oauth_server.py PORT_FILE LOG_FILE [--methods M,..] [--scopes S,..] [--call-scope S]
                    [--endless-scope] [--expires-in SECONDS] [--issuer-path P] [--login]

It listens on a free port of 127.0.0.1 and writes the port to PORT_FILE. Its MCP
endpoint is /mcp: without a valid bearer token it answers 401 with a challenge naming its
protected resource metadata; `tools/call` also needs the scope `--call-scope` (403
insufficient_scope otherwise), or, with `--endless-scope`, a new scope every time. Its
authorization server takes the client credentials grant, authenticated as the metadata
says (`--methods`: client_secret_basic, client_secret_post, private_key_jwt), with the
client `gateway` and the secret `s3cret`; a JWT assertion is recorded, not verified (the
test verifies it). With `--login` it also takes the authorization code grant with PKCE
(its /authorize approves at once and redirects back), registers public clients
(/register) and rotates refresh tokens: each is good for one refresh.

Every token request and every MCP request is appended to LOG_FILE as a JSON line, with
what the test checks (grant, scope, resource, how the client authenticated, the bearer
token presented). POST /revoke revokes every token issued so far.
"""

import argparse
import base64
import hashlib
import json
import os
import sys
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

CLIENT_ID = "gateway"
SECRET = "s3cret"

parser = argparse.ArgumentParser()
parser.add_argument("port_file")
parser.add_argument("log_file")
parser.add_argument("--methods", default="client_secret_basic")
parser.add_argument("--scopes", default="tools:read")
parser.add_argument("--call-scope", default="")
parser.add_argument("--endless-scope", action="store_true")
parser.add_argument("--expires-in", type=int, default=3600)
parser.add_argument("--issuer-path", default="")
parser.add_argument("--login", action="store_true")
args = parser.parse_args()

lock = threading.Lock()
tokens = {}  # token -> set of scopes
revoked = set()
codes = {}  # code -> (code_challenge, redirect_uri, scopes)
refresh_tokens = {}  # refresh token -> scopes; removed when used
counter = [0]


def log(entry):
    with lock, open(args.log_file, "a") as out:
        out.write(json.dumps(entry) + "\n")


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *_):
        pass

    def base(self):
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def reply(self, status, body=None, headers=()):
        data = b"" if body is None else json.dumps(body).encode()
        self.send_response(status)
        for name, value in headers:
            self.send_header(name, value)
        if body is not None:
            self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def read(self):
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def do_GET(self):
        issuer = self.base() + args.issuer_path
        if self.path == "/.well-known/oauth-protected-resource/mcp":
            self.reply(200, {
                "resource": self.base() + "/mcp",
                "authorization_servers": [issuer],
                "scopes_supported": [s for s in args.scopes.split(",") if s],
            })
        elif self.path == "/.well-known/oauth-authorization-server" + args.issuer_path:
            self.reply(200, {
                "issuer": issuer,
                "authorization_endpoint": issuer + "/authorize",
                "token_endpoint": self.base() + "/token",
                "response_types_supported": ["code"],
                "grant_types_supported": ["client_credentials"] + (
                    ["authorization_code", "refresh_token"] if args.login else []),
                "code_challenge_methods_supported": ["S256"],
                **({"registration_endpoint": self.base() + "/register"} if args.login else {}),
                "token_endpoint_auth_methods_supported": args.methods.split(","),
                "token_endpoint_auth_signing_alg_values_supported": ["ES256"],
            })
        elif self.path.startswith("/authorize") and args.login:
            self.authorize()
        else:
            # No GET stream: the client falls back to POST responses.
            self.reply(405)

    def authorize(self):
        query = {k: v[0] for k, v in
                 urllib.parse.parse_qs(urllib.parse.urlparse(self.path).query).items()}
        log({"kind": "authorize", "client_id": query.get("client_id"),
             "scope": query.get("scope"), "resource": query.get("resource"),
             "code_challenge_method": query.get("code_challenge_method")})
        with lock:
            counter[0] += 1
            code = f"code-{counter[0]}"
            codes[code] = (query.get("code_challenge"), query.get("redirect_uri"),
                           set((query.get("scope") or "").split()))
        target = query["redirect_uri"] + "?" + urllib.parse.urlencode(
            {"code": code, "state": query.get("state", "")})
        self.send_response(302)
        self.send_header("Location", target)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_DELETE(self):
        self.reply(405)

    def do_POST(self):
        body = self.read()
        if self.path == "/token":
            return self.token(body)
        if self.path == "/register" and args.login:
            registration = json.loads(body)
            log({"kind": "register", "redirect_uris": registration.get("redirect_uris")})
            return self.reply(201, {"client_id": "registered-1",
                                    "token_endpoint_auth_method": "none",
                                    "redirect_uris": registration.get("redirect_uris")})
        if self.path == "/revoke":
            with lock:
                revoked.update(tokens)
            return self.reply(204)
        if self.path == "/mcp":
            return self.mcp(body)
        self.reply(404)

    def token(self, body):
        form = {k: v[0] for k, v in urllib.parse.parse_qs(body.decode()).items()}
        authorization = self.headers.get("Authorization", "")
        entry = {"kind": "token", "grant_type": form.get("grant_type"),
                 "scope": form.get("scope"), "resource": form.get("resource")}
        client = None
        if authorization.startswith("Basic "):
            user, _, password = base64.b64decode(authorization[6:]).decode().partition(":")
            entry["auth"] = "client_secret_basic"
            client = (urllib.parse.unquote_plus(user), urllib.parse.unquote_plus(password))
        elif "client_secret" in form:
            entry["auth"] = "client_secret_post"
            client = (form.get("client_id"), form["client_secret"])
        elif "client_assertion" in form:
            entry["auth"] = "private_key_jwt"
            entry["assertion"] = form["client_assertion"]
            entry["assertion_type"] = form.get("client_assertion_type")
            client = (CLIENT_ID, SECRET)
        grant = form.get("grant_type")
        if args.login and grant in ("authorization_code", "refresh_token"):
            entry["client_id"] = form.get("client_id")
            log(entry)
            return self.code_grant(grant, form)
        log(entry)
        if client != (CLIENT_ID, SECRET):
            return self.reply(401, {"error": "invalid_client",
                                    "error_description": "unknown client or wrong secret"})
        if form.get("grant_type") != "client_credentials":
            return self.reply(400, {"error": "unsupported_grant_type"})
        with lock:
            counter[0] += 1
            token = f"token-{counter[0]}"
            tokens[token] = set((form.get("scope") or "").split())
        self.reply(200, {"access_token": token, "token_type": "Bearer",
                         "expires_in": args.expires_in, "scope": form.get("scope") or ""})

    def code_grant(self, grant, form):
        with lock:
            if grant == "authorization_code":
                challenge, redirect, scopes = codes.pop(form.get("code"), (None, None, None))
                verifier = form.get("code_verifier") or ""
                computed = base64.urlsafe_b64encode(
                    hashlib.sha256(verifier.encode()).digest()).decode().rstrip("=")
                if challenge is None or computed != challenge \
                        or redirect != form.get("redirect_uri"):
                    return self.reply(400, {"error": "invalid_grant"})
            else:
                scopes = refresh_tokens.pop(form.get("refresh_token"), None)
                if scopes is None:
                    return self.reply(400, {"error": "invalid_grant"})
            counter[0] += 1
            token = f"token-{counter[0]}"
            refresh = f"refresh-{counter[0]}"
            tokens[token] = scopes
            refresh_tokens[refresh] = scopes
        self.reply(200, {"access_token": token, "token_type": "Bearer",
                         "expires_in": args.expires_in, "refresh_token": refresh,
                         "scope": " ".join(sorted(scopes))})

    def challenge(self, status, error, scope=None):
        value = (f'Bearer resource_metadata="{self.base()}/.well-known/oauth-protected-resource/mcp"')
        if error:
            value += f', error="{error}"'
        if scope:
            value += f', scope="{scope}"'
        self.reply(status, {"error": error or "unauthorized"}, [("WWW-Authenticate", value)])

    def mcp(self, body):
        message = json.loads(body)
        authorization = self.headers.get("Authorization", "")
        token = authorization[7:] if authorization.startswith("Bearer ") else None
        log({"kind": "mcp", "method": message.get("method"), "token": token})
        with lock:
            scopes = tokens.get(token) if token not in revoked else None
        if scopes is None:
            return self.challenge(401, "invalid_token" if token else None,
                                  args.scopes.replace(",", " "))
        method = message.get("method")
        if "id" not in message:
            return self.reply(202)
        if method == "initialize":
            result = {"protocolVersion": message["params"]["protocolVersion"],
                      "capabilities": {"tools": {}},
                      "serverInfo": {"name": "oauth-test-server", "version": "1"}}
        elif method == "tools/list":
            result = {"tools": [{"name": "whoami", "inputSchema": {"type": "object"},
                                 "annotations": {"readOnlyHint": True}}]}
        elif method == "tools/call":
            needed = args.call_scope
            if args.endless_scope:
                needed = f"more:{len(scopes)}"
            if needed and needed not in scopes:
                return self.challenge(403, "insufficient_scope", needed)
            result = {"content": [{"type": "text", "text": " ".join(sorted(scopes))}]}
        elif method == "ping":
            result = {}
        else:
            return self.reply(200, {"jsonrpc": "2.0", "id": message["id"],
                                    "error": {"code": -32601, "message": "no such method"}})
        self.reply(200, {"jsonrpc": "2.0", "id": message["id"], "result": result})


server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
with open(args.port_file + ".tmp", "w") as out:
    out.write(str(server.server_address[1]))
os.rename(args.port_file + ".tmp", args.port_file)
try:
    server.serve_forever()
except KeyboardInterrupt:
    sys.exit(0)
