"""Adapters to the Kubernetes API, through the official client: resolve targets, check RBAC, add the debug
container, exec capture streams, reach the sidecar's Envoy admin (port-forward) and follow its log."""
