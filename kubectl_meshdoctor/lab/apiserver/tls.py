"""Optional TLS (`--tls`): a throwaway self-signed certificate made with the openssl CLI.

Plain HTTP is enough for the Python client, but kubectl (client-go) never sends a bearer token over plain HTTP,
so `kubectl get pods` against the lab needs HTTPS. The certificate is its own CA, valid for 127.0.0.1, ::1 and
localhost, and goes into the kubeconfig as certificate-authority-data.
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
    cert_pem: bytes
    context: ssl.SSLContext


def make_tls(workdir: Path, host: str, days: int = 30) -> TlsMaterial:
    """Create key + cert in `workdir` (caller removes it). Raises RuntimeError when openssl is missing or fails."""
    openssl = shutil.which("openssl")
    if openssl is None:
        raise RuntimeError("--tls needs the openssl command")
    key, cert = workdir / "tls.key", workdir / "tls.crt"
    sans = {"IP:127.0.0.1", "IP:::1", "DNS:localhost"}
    if host not in ("", "0.0.0.0", "::"):
        try:
            sans.add(f"IP:{ipaddress.ip_address(host)}")
        except ValueError:
            sans.add(f"DNS:{host}")
    proc = subprocess.run(
        [openssl, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
         "-days", str(days), "-subj", "/CN=meshdoctor-lab-apiserver", "-addext",
         "subjectAltName=" + ",".join(sorted(sans)), "-keyout", str(key), "-out", str(cert)],
        capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"openssl failed: {proc.stderr.strip()}")
    key.chmod(0o600)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    return TlsMaterial(cert.read_bytes(), context)
