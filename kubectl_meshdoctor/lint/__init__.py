"""Static lint of Istio sidecar pods: ``lint_pod(pod) -> list[Finding]``, ``lint_pods(pods)``.

Rule ids are stable (docs/DESIGN.md): redirect-exposure, probe-port, restart-loop, no-sidecar, sidecar-not-ready,
hold-application, probe-not-rewritten, excluded-port-exposed. ``RULES`` maps each id to its function,
``SEVERITIES`` to the severities it can emit.
"""

from .podview import PodView
from .probes import RESTART_THRESHOLD
from .rules import RULES, SEVERITIES, lint_pod, lint_pods

__all__ = ["RESTART_THRESHOLD", "RULES", "SEVERITIES", "PodView", "lint_pod", "lint_pods"]
