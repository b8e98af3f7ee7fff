"""Adapters to the Kubernetes API: resolve targets, add the debug container, exec capture streams."""
