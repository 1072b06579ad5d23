#!/usr/bin/env python3
"""e2e/controlplane/issuer.py — the labs' identity provider (Python 3 stdlib and the openssl CLI), the
shape of a cloud's: the API server's JWT authenticator trusts its tokens
(e2e/controlplane/run up --issuer), and `flexnode token` gets them.

  GET  /.well-known/openid-configuration   discovery: the issuer, its keys' URL
  GET  /jwks                                its one RS256 key
  POST /token                               OAuth 2 client credentials (a service
                                            principal): grant_type=client_credentials,
                                            client_id, client_secret, scope=AUDIENCE
  GET  /metadata/identity/oauth2/token?client_id=ID&resource=AUDIENCE   with header
                                            `Metadata: true` (a managed identity: the node is
                                            the identity, no secret), on the plain-http
                                            --metadata-port only (loopback)

A token is a JWT: iss (--issuer), sub (the client ID), aud (the audience asked, one of
--audiences), node (the client's node), iat/nbf/exp (--ttl seconds). Clients are files
DIR/clients/ID.json: {"node": NODE, "secret": SECRET} (secret absent: a metadata identity
only), read at each request, so `e2e/controlplane/run issuer-client` adds them while it runs.

  issuer.py --dir DIR --issuer URL --tls-cert PEM --tls-key PEM [--port PORT] [--metadata-port P]
        [--audiences a,b] [--ttl SECONDS] [--pid-file F] [--port-file F] [--log F]

Secrets and tokens are never logged: a log line is `time method path status client audience`.
"""

import argparse
import base64
import hmac
import http.server
import json
import os
import re
import signal
import socketserver
import ssl
import subprocess
import sys
import threading
import time
import urllib.parse

ID_RE = re.compile(r"^[a-z0-9][a-z0-9.-]{0,62}$")


def b64url(data):
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


class Issuer:
    def __init__(self, args):
        self.args = args
        self.key = os.path.join(args.dir, "signing.key")
        if not os.path.exists(self.key):
            subprocess.run(["openssl", "genrsa", "-out", self.key, "2048"], check=True,
                           capture_output=True)
            os.chmod(self.key, 0o600)
        out = subprocess.run(["openssl", "rsa", "-in", self.key, "-noout", "-modulus"], check=True,
                             capture_output=True, text=True).stdout
        modulus = bytes.fromhex(out.strip().split("=", 1)[1])
        self.kid = b64url(modulus[-12:])
        self.jwk = {"kty": "RSA", "alg": "RS256", "use": "sig", "kid": self.kid,
                    "n": b64url(modulus), "e": "AQAB"}
        self.lock = threading.Lock()

    def client(self, client_id):
        if not ID_RE.match(client_id or ""):
            return None
        try:
            with open(os.path.join(self.args.dir, "clients", client_id + ".json")) as f:
                return json.load(f)
        except (OSError, ValueError):
            return None

    def token(self, client_id, node, audience):
        now = int(time.time())
        header = {"alg": "RS256", "typ": "JWT", "kid": self.kid}
        claims = {"iss": self.args.issuer, "sub": client_id, "aud": audience, "node": node,
                  "iat": now, "nbf": now - 5, "exp": now + self.args.ttl}
        signing_input = (b64url(json.dumps(header).encode()) + "." +
                         b64url(json.dumps(claims).encode())).encode()
        sig = subprocess.run(["openssl", "dgst", "-sha256", "-sign", self.key], input=signing_input,
                             check=True, capture_output=True).stdout
        return signing_input.decode() + "." + b64url(sig), self.args.ttl


def handler(issuer, metadata_only):
    args = issuer.args

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, fmt, *a):
            pass

        def log(self, status, client="-", audience="-"):
            with issuer.lock:
                print("%s %s %s %d %s %s" % (time.strftime("%H:%M:%S"), self.command,
                                             urllib.parse.urlsplit(self.path).path, status, client,
                                             audience or "-"), file=LOG, flush=True)

        def reply(self, status, body, client="-", audience="-"):
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(data)
            self.log(status, client, audience)

        def refuse(self, status, error, description, client="-"):
            self.reply(status, {"error": error, "error_description": description}, client)

        def issue(self, client_id, node, audience):
            if audience not in args.audiences:
                return self.refuse(400, "invalid_scope", "unknown audience", client_id)
            token, ttl = issuer.token(client_id, node, audience)
            self.reply(200, {"access_token": token, "token_type": "Bearer", "expires_in": ttl},
                       client_id, audience)

        def do_GET(self):
            url = urllib.parse.urlsplit(self.path)
            q = dict(urllib.parse.parse_qsl(url.query))
            if metadata_only:
                if url.path != "/metadata/identity/oauth2/token":
                    return self.refuse(404, "not_found", "no such path")
                if self.headers.get("Metadata") != "true":
                    return self.refuse(400, "invalid_request", "the Metadata: true header is required")
                c = issuer.client(q.get("client_id"))
                if not c or c.get("secret"):
                    return self.refuse(400, "invalid_request", "no such managed identity", q.get("client_id", "-"))
                if q.get("resource") not in args.audiences:
                    return self.refuse(400, "invalid_resource", "unknown resource", q["client_id"])
                # Azure's metadata endpoint sends expires_in as a string.
                token, ttl = issuer.token(q["client_id"], c["node"], q["resource"])
                return self.reply(200, {"access_token": token, "expires_in": str(ttl),
                                        "token_type": "Bearer"}, q["client_id"], q["resource"])
            if url.path == "/.well-known/openid-configuration":
                return self.reply(200, {"issuer": args.issuer, "jwks_uri": args.issuer + "/jwks",
                                        "token_endpoint": args.issuer + "/token",
                                        "response_types_supported": ["id_token"],
                                        "subject_types_supported": ["public"],
                                        "id_token_signing_alg_values_supported": ["RS256"]})
            if url.path == "/jwks":
                return self.reply(200, {"keys": [issuer.jwk]})
            self.refuse(404, "not_found", "no such path")

        def do_POST(self):
            if metadata_only or urllib.parse.urlsplit(self.path).path != "/token":
                return self.refuse(404, "not_found", "no such path")
            n = int(self.headers.get("Content-Length") or 0)
            if n > 65536:
                return self.refuse(413, "invalid_request", "too large")
            form = dict(urllib.parse.parse_qsl(self.rfile.read(n).decode(errors="replace")))
            if form.get("grant_type") != "client_credentials":
                return self.refuse(400, "unsupported_grant_type", "client_credentials only")
            cid = form.get("client_id", "")
            c = issuer.client(cid)
            if not c or not c.get("secret") or not hmac.compare_digest(
                    c["secret"].encode(), form.get("client_secret", "").encode()):
                return self.refuse(401, "invalid_client", "unknown client or wrong secret", cid if c else "-")
            self.issue(cid, c["node"], form.get("scope", ""))

    return Handler


class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    allow_reuse_address = True


def main():
    global LOG
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dir", required=True)
    p.add_argument("--issuer", required=True)
    p.add_argument("--tls-cert", required=True)
    p.add_argument("--tls-key", required=True)
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--metadata-port", type=int)
    p.add_argument("--audiences", default="flexnode,kubelet")
    p.add_argument("--ttl", type=int, default=900)
    p.add_argument("--pid-file")
    p.add_argument("--port-file")
    p.add_argument("--log")
    args = p.parse_args()
    args.audiences = args.audiences.split(",")
    os.makedirs(os.path.join(args.dir, "clients"), exist_ok=True)
    LOG = open(args.log, "a") if args.log else sys.stderr
    issuer = Issuer(args)
    https = Server(("127.0.0.1", args.port), handler(issuer, False))
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(args.tls_cert, args.tls_key)
    https.socket = ctx.wrap_socket(https.socket, server_side=True)
    servers = [https]
    if args.metadata_port is not None:
        servers.append(Server(("127.0.0.1", args.metadata_port), handler(issuer, True)))
    for s in servers[1:]:
        threading.Thread(target=s.serve_forever, daemon=True).start()

    def stop(*_):
        for f in (args.pid_file, args.port_file):
            if f:
                try:
                    os.unlink(f)
                except OSError:
                    pass
        sys.exit(0)
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    if args.pid_file:
        with open(args.pid_file, "w") as f:
            f.write("%d\n" % os.getpid())
    if args.port_file:
        ports = [str(s.server_address[1]) for s in servers]
        with open(args.port_file + ".tmp", "w") as f:
            f.write(" ".join(ports) + "\n")
        os.replace(args.port_file + ".tmp", args.port_file)
    https.serve_forever()


LOG = sys.stderr

if __name__ == "__main__":
    main()
