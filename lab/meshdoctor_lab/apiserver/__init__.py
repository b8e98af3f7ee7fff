"""The lab's test Kubernetes API server: real API shapes for lab pods, exec/port-forward into their namespaces.

Run it as `python -m meshdoctor_lab.apiserver --state STATE_JSON --kubeconfig OUT --port 0`.
"""

from .routes import LabApiServer
from .objects import LabConfig

__all__ = ["LabApiServer", "LabConfig"]
