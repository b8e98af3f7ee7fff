"""Connecting to the cluster the way kubectl does: KUBECONFIG, --kubeconfig, --context, -n/--namespace."""

from __future__ import annotations

import os
from dataclasses import dataclass

from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.config.config_exception import ConfigException


class KubeError(Exception):
    """A cluster-side problem worth one line on stderr (exit 2): no kubeconfig, pod not found, forbidden."""


@dataclass(frozen=True, slots=True)
class KubeOptions:
    kubeconfig: str | None = None
    context: str | None = None
    namespace: str | None = None
    request_timeout_s: float = 30.0


@dataclass(frozen=True, slots=True)
class Kube:
    """An API client bound to one kubeconfig context and the namespace commands default to."""

    api: k8s.ApiClient
    namespace: str
    context: str
    request_timeout_s: float

    @property
    def core(self) -> k8s.CoreV1Api:
        return k8s.CoreV1Api(self.api)

    @property
    def apps(self) -> k8s.AppsV1Api:
        return k8s.AppsV1Api(self.api)


def connect(opts: KubeOptions) -> Kube:
    """Load the kubeconfig as kubectl would (``--kubeconfig``, else ``$KUBECONFIG``, else ``~/.kube/config``).

    Raises KubeError with a one-line message when there is no usable kubeconfig or context.
    """
    path = opts.kubeconfig or os.environ.get("KUBECONFIG", "").split(os.pathsep)[0] or None
    if path is None:
        path = os.path.expanduser("~/.kube/config")
    if not os.path.exists(path):
        raise KubeError(f"no kubeconfig at {path} (use --kubeconfig or set KUBECONFIG)")
    try:
        contexts, active = k8s_config.list_kube_config_contexts(config_file=path)
        ctx = next((c for c in contexts if c["name"] == opts.context), None) if opts.context else active
        if ctx is None:
            names = ", ".join(c["name"] for c in contexts) or "none"
            raise KubeError(f'context "{opts.context}" not found in {path} (contexts: {names})')
        api = k8s_config.new_client_from_config(config_file=path, context=ctx["name"])
    except ConfigException as e:
        raise KubeError(f"invalid kubeconfig {path}: {str(e).splitlines()[0]}") from None
    namespace = opts.namespace or ctx.get("context", {}).get("namespace") or "default"
    return Kube(api, namespace, ctx["name"], opts.request_timeout_s)


def api_error_message(e: Exception) -> str:
    """One line from an ApiException: the Status message when the server sent one, else the reason."""
    import json

    body = getattr(e, "body", None)
    if body:
        try:
            msg = json.loads(body).get("message")
            if msg:
                return str(msg)
        except (ValueError, AttributeError):
            pass
    status = getattr(e, "status", None)
    reason = getattr(e, "reason", None) or str(e)
    reason = str(reason).splitlines()[0]
    return f"{status} {reason}" if status else reason
