"""runners.kubelogs: launcher logs read on one event loop, as the kubernetes client would ask.

The fake API server of the other tests speaks plain HTTP; a real cluster speaks TLS, checks the
portal's client certificate or token, and the log request must carry both. Here a TLS server on
loopback requires a client certificate signed by its CA and the bearer token, and streams a log.
"""
import base64
import datetime
import http.server
import ssl
import threading
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from kubernetes import config

from runners import kubelogs

TOKEN = "s3cret-token"


def _cert(name, issuer=None, issuer_key=None, ca=False):
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.timezone.utc)
    builder = (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer or subject)
               .public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(hours=1))
               .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    if not ca:
        builder = builder.add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost")]), critical=False)
    return key, builder.sign(issuer_key or key, hashes.SHA256())


def _write(path, key, cert):
    path.with_suffix(".key").write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                           serialization.NoEncryption()))
    path.with_suffix(".crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return str(path.with_suffix(".crt")), str(path.with_suffix(".key"))


@pytest.fixture
def tls_api(tmp_path):
    """(https URL, CA file, client cert, client key, the requests the server saw)."""
    ca_key, ca = _cert("test-ca", ca=True)
    ca_file, _ = _write(tmp_path / "ca", ca_key, ca)
    server_cert = _write(tmp_path / "server", *_cert("localhost", ca.subject, ca_key))
    client_cert = _write(tmp_path / "client", *_cert("ringmaster", ca.subject, ca_key))
    seen = []

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self):
            seen.append((self.path, self.headers.get("Authorization"), self.connection.getpeercert()["subject"]))
            if self.headers.get("Authorization") != f"Bearer {TOKEN}":
                self.send_response(401)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for line in (b"2026-11-27T10:00:00.000000001Z [1,0]<stdout>:one\n",
                         b"2026-11-27T10:00:00.000000002Z [1,0]<stdout>:two\n"):
                self.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
            self.wfile.write(b"0\r\n\r\n")

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=ca_file)
    context.verify_mode = ssl.CERT_REQUIRED                   # no client certificate, no log
    context.load_cert_chain(*server_cert)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"https://localhost:{server.server_address[1]}", ca_file, *client_cert, seen
    server.shutdown()


def _api_client(host, ca_file, cert, key, token=TOKEN):
    """The client as the portal makes it for a cluster: from a kubeconfig with the CA, the
    client certificate and key inline, and a token (jobs.backends.kubernetes.clusters.api_client)."""
    def data(path):
        return base64.b64encode(Path(path).read_bytes()).decode()
    kubeconfig = {
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": host, "certificate-authority-data": data(ca_file)}}],
        "users": [{"name": "u", "user": {"token": token, "client-certificate-data": data(cert),
                                          "client-key-data": data(key)}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u", "namespace": "team-a"}}],
    }
    return config.new_client_from_config_dict(kubeconfig)


def _stream(api_client):
    got, ended = [], threading.Event()
    result = {}

    def on_end(error):
        result["error"] = error
        ended.set()
    kubelogs.open_stream(api_client, "team-a", "rm-x-1-launcher", "launcher", 30, (5, 10), got.append, on_end)
    assert ended.wait(20), "the stream never ended"
    return b"".join(got), result["error"]


def test_a_log_is_streamed_over_tls_with_the_clusters_ca_client_certificate_and_token(tls_api):
    host, ca_file, cert, key, seen = tls_api
    data, error = _stream(_api_client(host, ca_file, cert, key))
    assert error is None
    assert data.endswith(b"[1,0]<stdout>:one\n2026-11-27T10:00:00.000000002Z [1,0]<stdout>:two\n")
    path, authorization, subject = seen[-1]
    assert path == ("/api/v1/namespaces/team-a/pods/rm-x-1-launcher/log"
                    "?container=launcher&follow=true&timestamps=true&sinceSeconds=30")
    assert authorization == f"Bearer {TOKEN}" and subject == ((("commonName", "ringmaster"),),)


def test_a_refused_log_names_the_status_and_a_server_not_signed_by_the_ca_is_refused(tls_api, tmp_path):
    host, ca_file, cert, key, _ = tls_api
    _, error = _stream(_api_client(host, ca_file, cert, key, token="wrong"))
    assert isinstance(error, kubelogs.LogStreamError) and error.status == 401

    other_ca, _ = _write(tmp_path / "other", *_cert("other-ca", ca=True))
    _, error = _stream(_api_client(host, other_ca, cert, key))
    assert isinstance(error, Exception) and "certificate verify failed" in str(error)
