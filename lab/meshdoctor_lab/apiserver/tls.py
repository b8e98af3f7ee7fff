"""HTTPS for the lab API server: a throwaway CA and a server certificate it signs, made with the openssl CLI.

TLS is the default because kubectl (client-go) never sends a bearer token over plain HTTP: without it `kubectl get
pods` against the lab is anonymous and fails. Each server start makes a new CA (EC P-256, valid `days` days) whose
private key lives only in the server's temporary directory and dies with it; the CA certificate goes into the
kubeconfig as `certificate-authority-data`, so kubectl, the Python client and urllib (`ssl_context`) verify the
server as they would a cluster's. The server certificate names 127.0.0.1, ::1, localhost and the listen host.
"""

from __future__ import annotations

import ipaddress
import shutil
import ssl
import subprocess
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class TlsMaterial:
    """`ca_pem`: the CA certificate (PEM) clients trust; `context`: the server's SSL context."""

    ca_pem: bytes
    context: ssl.SSLContext

    @property
    def cert_pem(self) -> bytes:
        """The certificate clients must trust (the CA's); kept under the old name for callers of `--tls`."""
        return self.ca_pem


def _sans(host: str) -> list[str]:
    sans = {"IP:127.0.0.1", "IP:::1", "DNS:localhost"}
    if host not in ("", "0.0.0.0", "::"):
        try:
            sans.add(f"IP:{ipaddress.ip_address(host)}")
        except ValueError:
            sans.add(f"DNS:{host}")
    return sorted(sans)


def _openssl(openssl: str, *args: str) -> None:
    proc = subprocess.run([openssl, *args], capture_output=True, text=True, timeout=60)
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no message"])[-1]
        raise RuntimeError(f"openssl {args[0]} failed: {last}")


def make_tls(workdir: Path, host: str, days: int = 30) -> TlsMaterial:
    """Create a CA and a server certificate in `workdir` (the caller removes it). Raises RuntimeError when openssl
    is missing or fails."""
    openssl = shutil.which("openssl")
    if openssl is None:
        raise RuntimeError("serving HTTPS needs the openssl command (apt-get install openssl)")
    ca_key, ca_crt = workdir / "ca.key", workdir / "ca.crt"
    key, csr, crt, ext = workdir / "tls.key", workdir / "tls.csr", workdir / "tls.crt", workdir / "tls.ext"
    curve = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    _openssl(openssl, "req", "-x509", *curve, "-days", str(days), "-subj", "/CN=meshdoctor-lab-ca",
             "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign",
             "-keyout", str(ca_key), "-out", str(ca_crt))
    _openssl(openssl, "req", "-new", *curve, "-subj", "/CN=meshdoctor-lab-apiserver", "-keyout", str(key),
             "-out", str(csr))
    # RFC 5280 4.2.1.12: extendedKeyUsage serverAuth; Go's verifier insists on it for a server certificate.
    ext.write_text("basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature\n"
                   "extendedKeyUsage=serverAuth\nsubjectAltName=" + ",".join(_sans(host)) + "\n")
    _openssl(openssl, "x509", "-req", "-in", str(csr), "-CA", str(ca_crt), "-CAkey", str(ca_key),
             "-CAcreateserial", "-days", str(days), "-extfile", str(ext), "-out", str(crt))
    for private in (ca_key, key):
        private.chmod(0o600)
    # The server sends its whole chain (leaf, then the CA), as servers should (RFC 8446 4.4.2): a client that
    # does not trust our CA then says "self-signed certificate in certificate chain", which names the cause.
    chain = workdir / "chain.crt"
    chain.write_bytes(crt.read_bytes() + ca_crt.read_bytes())
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(chain, key)
    return TlsMaterial(ca_crt.read_bytes(), context)


def client_context(ca_pem: bytes) -> ssl.SSLContext:
    """An SSL context that trusts exactly `ca_pem` (for urllib calls to the lab's admin endpoints)."""
    return ssl.create_default_context(cadata=ca_pem.decode("ascii"))
