"""The kubeconfig that points the official client (and kubectl) at the lab API server."""

from __future__ import annotations

import base64
import os
import tempfile
from pathlib import Path
from typing import Any

import yaml

CONTEXT = "meshdoctor-lab"


def kubeconfig_dict(server: str, token: str, namespace: str, cluster: str = CONTEXT,
                    ca_pem: bytes | None = None) -> dict[str, Any]:
    """Cluster `server` (http, or https trusting `ca_pem`), a bearer-token user, context `meshdoctor-lab`
    (current) in `namespace`."""
    cluster_entry: dict[str, Any] = {"server": server}
    if ca_pem is not None:
        cluster_entry["certificate-authority-data"] = base64.b64encode(ca_pem).decode("ascii")
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "preferences": {},
        "clusters": [{"name": cluster, "cluster": cluster_entry}],
        "users": [{"name": cluster, "user": {"token": token}}],
        "contexts": [{"name": CONTEXT, "context": {"cluster": cluster, "user": cluster, "namespace": namespace}}],
        "current-context": CONTEXT,
    }


def write_kubeconfig(path: Path, config: dict[str, Any]) -> None:
    """Write atomically (temp file + rename, mode 0600: it holds the token) so that the file existing means the
    server is ready. Raises OSError."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            yaml.safe_dump(config, f, sort_keys=False)
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
