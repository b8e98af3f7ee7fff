"""Istio resources that findings recommend, as YAML to paste (networking.istio.io/v1). One writer for each kind,
so every detector's fix reads the same way; ``<service>`` and ``<namespace>`` are for the user to fill in."""

from __future__ import annotations

_VIRTUAL_SERVICE = """\
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata:
  name: <service>
spec:
  hosts: [<service>]
  http:
  - route:
    - destination:
        host: <service>
"""


def virtual_service_retries(attempts: int, retry_on: str, per_try_timeout: str | None = None) -> str:
    """A VirtualService that retries the route ``attempts`` times on ``retry_on`` (Envoy's x-envoy-retry-on)."""
    per_try = f"\n      perTryTimeout: {per_try_timeout}" if per_try_timeout else ""
    return _VIRTUAL_SERVICE + f"    retries:\n      attempts: {attempts}\n      retryOn: {retry_on}{per_try}"


def virtual_service_timeout(timeout: str, per_try_timeout: str | None = None, comment: str = "") -> str:
    """A VirtualService whose route waits ``timeout`` for the app (Envoy's route timeout; Istio's default is
    none), optionally retrying with ``per_try_timeout`` per attempt."""
    note = f"  # {comment}" if comment else ""
    retries = f"\n    retries:\n      attempts: 2\n      perTryTimeout: {per_try_timeout}" if per_try_timeout else ""
    return _VIRTUAL_SERVICE + f"    timeout: {timeout}{note}{retries}"


def destination_rule_pool(protocol: str, setting: str, value: str, comment: str = "") -> str:
    """A DestinationRule setting one connection-pool field, e.g. ("http", "idleTimeout", "50s")."""
    note = f"          # {comment}" if comment else ""
    return f"""\
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata:
  name: <service>
spec:
  host: <service>.<namespace>.svc.cluster.local
  trafficPolicy:
    connectionPool:
      {protocol}:
        {setting}: {value}{note}"""
