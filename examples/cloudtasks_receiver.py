"""A receiver of Cloud Tasks push requests that verifies their OIDC ID token.

Run it, then cloudtasks_producer.py:  python examples/cloudtasks_receiver.py  (on :8099)

It checks the token with PyJWT (`pip install "pyjwt[crypto]"`) against TaskForge's
/.well-known/jwks.json, as it would against Google's, and prints each task it gets.
Nothing in it is TaskForge's: the same lines verify a token Google signed, with
Google's JWKS URL and issuer.
"""

from __future__ import annotations

import json
import os
import urllib.request
from http.server import BaseHTTPRequestHandler, HTTPServer

import jwt

TASKFORGE = os.environ.get("TASKFORGE_URL", "http://localhost:8080")
PORT = int(os.environ.get("RECEIVER_PORT", "8099"))
AUDIENCE = os.environ.get("RECEIVER_AUDIENCE", f"http://localhost:{PORT}/")
# The issuer is TASKFORGE_OIDC_ISSUER, which production sets to TASKFORGE's public URL.
with urllib.request.urlopen(f"{TASKFORGE}/.well-known/openid-configuration") as answer:
    ISSUER = json.load(answer)["issuer"]
JWKS = jwt.PyJWKClient(f"{TASKFORGE}/.well-known/jwks.json")


class Handler(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        token = self.headers.get("Authorization", "").removeprefix("Bearer ")
        try:
            claims = jwt.decode(
                token,
                JWKS.get_signing_key_from_jwt(token).key,
                algorithms=["RS256"],
                audience=AUDIENCE,
                issuer=ISSUER,
            )
        except jwt.PyJWTError as exc:
            print(f"refused: {exc}", flush=True)
            self.send_response(401)
            self.end_headers()
            return
        print(
            f"task {self.headers['X-CloudTasks-TaskName']} from {claims['email']}, "
            f"attempt {int(self.headers['X-CloudTasks-TaskRetryCount']) + 1}: {body.decode()}",
            flush=True,
        )
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


if __name__ == "__main__":
    HTTPServer(("127.0.0.1", PORT), Handler).serve_forever()
