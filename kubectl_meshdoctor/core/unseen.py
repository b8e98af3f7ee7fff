"""What a run's packets could not show because one of the pod's two interfaces was not captured.

The detectors act on a pod's ``lo`` (the sidecar and the app, the app's REDIRECTed outbound SYNs) and ``eth0``
(the pod and the rest of the cluster); some failure classes cross only one of them. A run given ``lo.pcap`` alone
that says "no failure seen" must also say that what only ``eth0`` carries could not be seen, and the other way
round. Which class crosses which interface is each detector's own rule (docs/DESIGN.md, "Detector ids"; the
``ev.iface`` tests in plugins/): e.g. tuple_collision.py acts on the challenge ACK on eth0 (on lo it reads only the
app's REDIRECTed SYNs), conntrack_invalid.py returns at once on lo (the REDIRECT is in PREROUTING: only what
arrives on eth0 can miss it), upstream_refused.py and startup_ordering.py act on lo alone.
"""

from __future__ import annotations

from dataclasses import dataclass

# Failure classes whose packets cross only eth0 (detector id, what a reader would miss), from the detectors' rules.
ONLY_ETH0: tuple[tuple[str, str], ...] = (
    ("tuple-collision", "the collision's challenge ACK"),
    ("syn-timeout", "SYN timeouts to other hosts"),
    ("tls-mismatch", "mTLS on the wire"),
    ("conntrack-invalid", "INVALID segments past the REDIRECT"),
    ("shutdown-ordering", "a stopped sidecar's refusals"),
    ("stale-keepalive", "callers reusing closed connections"),
)
# Failure classes whose packets cross only lo.
ONLY_LO: tuple[tuple[str, str], ...] = (
    ("upstream-refused", "the app refusing the sidecar"),
    ("startup-ordering", "the app starting before its sidecar"),
    ("http-framing", "malformed HTTP/1 responses"),
    ("server-first-protocol", "server-first apps"),
    ("stale-keepalive", "the app closing pooled connections"),
)
ROLES = ("lo", "eth0")


@dataclass(frozen=True, slots=True)
class Unseen:
    """One pod's missing interface: ``pod`` (None for the run's one unnamed pod), ``missing`` (lo or eth0, the
    interface no packet came from), ``classes`` ((detector id, what) pairs only it would show)."""

    pod: str | None
    missing: str
    classes: tuple[tuple[str, str], ...]

    def line(self) -> str:
        """One line for a text report: ``not seen: lo only (no eth0 packet), so none of ... could show; ...``."""
        whose = f"pod/{self.pod}: " if self.pod else ""
        have = "eth0" if self.missing == "lo" else "lo"
        what = ", ".join(w for _, w in self.classes)
        return (f"not seen: {whose}{have} only (no {self.missing} packet), so none of {what} could show; give "
                f"{self.missing} too")

    def to_dict(self) -> dict:
        return {**({"pod": self.pod} if self.pod else {}), "missing": self.missing,
                "classes": [{"detector": d, "what": w} for d, w in self.classes]}


def unseen(by_iface: dict[str, int]) -> list[Unseen]:
    """For the interfaces packets came from (``by_iface``: ``lo``/``eth0``, or ``pod/lo`` with several pods, ->
    packets analysed), each pod that had packets from one of lo and eth0 and none from the other, with the classes
    only the other shows. A pod with neither (no packet at all) or both is not listed; other interfaces (``any``,
    a stem) say nothing of either."""
    pods: dict[str | None, set[str]] = {}
    for key, packets in by_iface.items():
        pod, _, iface = key.rpartition("/")
        if packets and iface in ROLES:
            pods.setdefault(pod or None, set()).add(iface)
    out: list[Unseen] = []
    for pod, seen in pods.items():
        if len(seen) == 1:
            missing = "eth0" if seen == {"lo"} else "lo"
            out.append(Unseen(pod, missing, ONLY_ETH0 if missing == "eth0" else ONLY_LO))
    return out
