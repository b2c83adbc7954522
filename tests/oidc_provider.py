"""A small OpenID Connect provider on loopback, for the single sign-on tests: discovery, JWKS,
the authorization endpoint (authorization code flow, PKCE S256 required), the token endpoint
(client secret by Basic or in the form, the code verifier checked, an RS256 ID token) and
userinfo. Whoever reaches the authorization endpoint is taken to have signed in as `provider.user`
(the claims: sub, email, preferred_username, groups ...), as at a provider where the browser
already has a session. Standard library, PyJWT and cryptography only."""
import base64
import hashlib
import json
import secrets
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlencode, urlsplit

import jwt
from cryptography.hazmat.primitives.asymmetric import rsa


def s256(verifier):
    return base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(b"=").decode()


class Provider:
    def __init__(self, client_id="ringmaster", client_secret="s3cret"):
        self.client_id, self.client_secret = client_id, client_secret
        self.user = {}
        self.authorize_requests = []          # each authorization request's parameters
        self._codes = {}
        self._access = {}
        self._key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self._kid = secrets.token_hex(4)
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.issuer = f"http://127.0.0.1:{self._server.server_port}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True, name="oidc-provider")

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._server.shutdown()
        self._server.server_close()

    def discovery(self):
        return {
            "issuer": self.issuer,
            "authorization_endpoint": f"{self.issuer}/authorize",
            "token_endpoint": f"{self.issuer}/token",
            "userinfo_endpoint": f"{self.issuer}/userinfo",
            "jwks_uri": f"{self.issuer}/jwks",
            "response_types_supported": ["code"],
            "subject_types_supported": ["public"],
            "id_token_signing_alg_values_supported": ["RS256"],
            "code_challenge_methods_supported": ["S256"],
            "token_endpoint_auth_methods_supported": ["client_secret_basic", "client_secret_post"],
            "scopes_supported": ["openid", "profile", "email"],
        }

    def authorize(self, query):
        """(status, headers, body) for an authorization request."""
        params = {key: values[0] for key, values in parse_qs(query).items()}
        self.authorize_requests.append(params)
        problems = [name for name, ok in (
            ("client_id", params.get("client_id") == self.client_id),
            ("response_type", params.get("response_type") == "code"),
            ("scope", "openid" in params.get("scope", "").split()),
            ("redirect_uri", params.get("redirect_uri", "").startswith("http")),
            ("code_challenge", bool(params.get("code_challenge"))),
            ("code_challenge_method", params.get("code_challenge_method") == "S256"),
        ) if not ok]
        if problems:
            return 400, {}, {"error": "invalid_request", "error_description": ", ".join(problems)}
        code = secrets.token_urlsafe(16)
        self._codes[code] = {**params, "claims": dict(self.user)}
        back = {"code": code, **({"state": params["state"]} if "state" in params else {})}
        return 302, {"Location": f"{params['redirect_uri']}?{urlencode(back)}"}, None

    def token(self, form, authorization):
        client_id, secret = form.get("client_id"), form.get("client_secret")
        if authorization.startswith("Basic "):
            client_id, _, secret = base64.b64decode(authorization[6:]).decode().partition(":")
        if (client_id, secret) != (self.client_id, self.client_secret):
            return 401, {}, {"error": "invalid_client"}
        grant = self._codes.pop(form.get("code", ""), None)
        if (grant is None or form.get("grant_type") != "authorization_code"
                or form.get("redirect_uri") != grant["redirect_uri"]):
            return 400, {}, {"error": "invalid_grant"}
        if s256(form.get("code_verifier", "")) != grant["code_challenge"]:
            return 400, {}, {"error": "invalid_grant", "error_description": "PKCE verifier"}
        now = int(time.time())
        claims = {"iss": self.issuer, "aud": self.client_id, "iat": now, "exp": now + 300, **grant["claims"]}
        if "nonce" in grant:
            claims["nonce"] = grant["nonce"]
        access = secrets.token_urlsafe(16)
        self._access[access] = grant["claims"]
        id_token = jwt.encode(claims, self._key, algorithm="RS256", headers={"kid": self._kid})
        return 200, {}, {"access_token": access, "token_type": "Bearer", "expires_in": 300, "id_token": id_token}

    def userinfo(self, authorization):
        claims = self._access.get(authorization.removeprefix("Bearer "))
        return (200, {}, claims) if claims is not None else (401, {}, {"error": "invalid_token"})

    def jwks(self):
        key = jwt.algorithms.RSAAlgorithm.to_jwk(self._key.public_key(), as_dict=True)
        return {"keys": [{**key, "kid": self._kid, "use": "sig", "alg": "RS256"}]}

    def _handler(self):
        provider = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self, status, headers, body):
                data = json.dumps(body).encode() if body is not None else b""
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                if body is not None:
                    self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                url = urlsplit(self.path)
                auth = self.headers.get("Authorization", "")
                answers = {
                    "/.well-known/openid-configuration": lambda: (200, {}, provider.discovery()),
                    "/jwks": lambda: (200, {}, provider.jwks()),
                    "/authorize": lambda: provider.authorize(url.query),
                    "/userinfo": lambda: provider.userinfo(auth),
                }
                self._answer(*answers.get(url.path, lambda: (404, {}, {"error": "not_found"}))())

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", "0"))).decode()
                form = {key: values[0] for key, values in parse_qs(body).items()}
                if urlsplit(self.path).path != "/token":
                    return self._answer(404, {}, {"error": "not_found"})
                self._answer(*provider.token(form, self.headers.get("Authorization", "")))

            def log_message(self, *args):
                pass

        return Handler
