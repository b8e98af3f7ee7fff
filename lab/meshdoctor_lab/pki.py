"""A lab's certificate authority and its workload certificates, made with openssl as istiod's CA issues them.

istiod's self-signed root (``O=cluster.local``) signs each workload a certificate with an empty subject and one
critical URI SAN, its SPIFFE id ``spiffe://cluster.local/ns/NS/sa/SA``, for server and client use, RSA 2048,
valid a day (istio/istio security/pkg/pki/util generate_cert.go, security/pkg/server/ca). The lab makes one CA a
lab (STATE_DIR/pki) and, for a pod whose sidecar speaks mTLS, its sidecar's certificate and one for the pod's
callers (STATE_DIR/POD/certs). Keys are files only root can read; Envoy, which runs as uid 1337, is given its
key in an environment variable (mesh_tls.py), never on its command line.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from meshdoctor_lab.mesh_tls import MeshIdentity
from meshdoctor_lab.state import LabError

KEY_ENV = "MESHDOCTOR_LAB_WORKLOAD_KEY"  # the environment variable Envoy reads its private key from
_TIMEOUT_S = 30.0
_EXTENSIONS = ("subjectAltName=critical,URI:{spiffe}\n"
               "keyUsage=critical,digitalSignature,keyEncipherment\n"
               "extendedKeyUsage=serverAuth,clientAuth\n"
               "basicConstraints=critical,CA:FALSE\n")


@dataclass(frozen=True)
class Issued:
    """A certificate the lab CA issued: its PEM files (certificate, private key, the CA's root) and SPIFFE id."""

    cert: Path
    key: Path
    root: Path
    spiffe: str

    def identity(self) -> MeshIdentity:
        """As a sidecar holds it (its key read from KEY_ENV)."""
        return MeshIdentity(self.spiffe, self.cert.read_text(), self.root.read_text(), KEY_ENV)


def _openssl(*args: str) -> None:
    try:
        done = subprocess.run(["openssl", *args], capture_output=True, text=True, timeout=_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise LabError(f"openssl {args[0]} failed: {exc}") from None
    if done.returncode != 0:
        last = (done.stderr.strip() or f"exit {done.returncode}").splitlines()[-1]
        raise LabError(f"openssl {args[0]} failed: {last}")


def lab_ca(directory: Path) -> tuple[Path, Path]:
    """The lab's root CA (certificate, key) in ``directory``, made on first use. Raises LabError."""
    cert, key = directory / "root-cert.pem", directory / "ca-key.pem"
    if not cert.exists():
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
                 "-days", "2", "-subj", "/O=cluster.local", "-addext", "basicConstraints=critical,CA:TRUE",
                 "-addext", "keyUsage=critical,keyCertSign,cRLSign")
        os.chmod(key, 0o600)
    return cert, key


def issue(ca_dir: Path, directory: Path, name: str, spiffe: str) -> Issued:
    """A workload certificate for ``spiffe`` signed by the lab CA in ``ca_dir``, written as ``name``.pem and
    ``name``-key.pem in ``directory``. Raises LabError."""
    root, ca_key = lab_ca(ca_dir)
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    cert, key, csr, ext = (directory / f"{name}.pem", directory / f"{name}-key.pem", directory / f"{name}.csr",
                           directory / f"{name}.ext")
    ext.write_text(_EXTENSIONS.format(spiffe=spiffe))
    try:
        _openssl("req", "-new", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-subj", "/",
                 "-out", str(csr))
        os.chmod(key, 0o600)
        _openssl("x509", "-req", "-in", str(csr), "-CA", str(root), "-CAkey", str(ca_key), "-set_serial",
                 str(int.from_bytes(os.urandom(8), "big")), "-days", "1", "-extfile", str(ext), "-out", str(cert))
    finally:
        csr.unlink(missing_ok=True)
        ext.unlink(missing_ok=True)
    return Issued(cert, key, root, spiffe)


def pod_certificates(ca_dir: Path, directory: Path, spiffe: str) -> Issued:
    """A pod's certificates in ``directory``: its sidecar's (``workload``), one for its callers' sidecars
    (``caller``, the same identity: the lab's callers are in the pod's namespace) and the root; returns the
    sidecar's. Raises LabError."""
    issue(ca_dir, directory, "caller", spiffe)
    issued = issue(ca_dir, directory, "workload", spiffe)
    root = directory / "root-cert.pem"
    root.write_text(issued.root.read_text())
    return Issued(issued.cert, issued.key, root, spiffe)


def workload(directory: Path, spiffe: str) -> Issued:
    """The sidecar's certificate pod_certificates made in ``directory``."""
    return Issued(directory / "workload.pem", directory / "workload-key.pem", directory / "root-cert.pem", spiffe)


def caller(directory: Path, spiffe: str) -> Issued:
    """The certificate pod_certificates made in ``directory`` for the pod's callers' sidecars."""
    return Issued(directory / "caller.pem", directory / "caller-key.pem", directory / "root-cert.pem", spiffe)
