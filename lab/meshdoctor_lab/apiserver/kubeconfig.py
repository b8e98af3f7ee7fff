"""The kubeconfig that points the official client (and kubectl) at the lab API server."""

from __future__ import annotations

import base64
import os
import tempfile
from pathlib import Path
from typing import Any

import yaml

DEFAULT_NAME = "meshdoctor-lab"


def kubeconfig_dict(server: str, token: str, namespace: str, cluster: str = DEFAULT_NAME,
                    ca_pem: bytes | None = None) -> dict[str, Any]:
    """Cluster `server` (http, or https trusting `ca_pem`), a bearer-token user, and a context (current) in
    `namespace`, all three named `cluster` (the lab's name: two labs' contexts differ, as kind names its
    contexts after each cluster)."""
    cluster_entry: dict[str, Any] = {"server": server}
    if ca_pem is not None:
        cluster_entry["certificate-authority-data"] = base64.b64encode(ca_pem).decode("ascii")
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "preferences": {},
        "clusters": [{"name": cluster, "cluster": cluster_entry}],
        "users": [{"name": cluster, "user": {"token": token}}],
        "contexts": [{"name": cluster, "context": {"cluster": cluster, "user": cluster, "namespace": namespace}}],
        "current-context": cluster,
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


def admin_call(kubeconfig: Path, method: str, path: str, body: Any = None, timeout: float = 10.0) -> Any:
    """Call one of the lab server's own endpoints (`/_lab/faults`) with the kubeconfig's server, token and CA.

    Returns the decoded JSON answer (None for an empty body). Raises OSError (urllib.error.URLError,
    HTTPError) when the server cannot be reached or answers an error."""
    import json
    import urllib.request

    from .tls import client_context

    kc = yaml.safe_load(Path(kubeconfig).read_text())
    cluster = kc["clusters"][0]["cluster"]
    ca = cluster.get("certificate-authority-data")
    context = client_context(base64.b64decode(ca)) if ca else None
    req = urllib.request.Request(
        cluster["server"] + path, method=method, data=json.dumps(body).encode() if body is not None else None,
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {kc['users'][0]['user']['token']}"})
    with urllib.request.urlopen(req, timeout=timeout, context=context) as resp:
        return json.loads(resp.read() or b"null")
