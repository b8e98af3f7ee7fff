"""What a run's packets could not show because one of the pod's two interfaces was not captured.

The detectors act on a pod's ``lo`` (the sidecar and the app, the app's REDIRECTed outbound SYNs) and ``eth0``
(the pod and the rest of the cluster); some failure classes cross only one of them. A run given ``lo.pcap`` alone
that says "no failure seen" must also say that what only ``eth0`` carries could not be seen, and the other way
round. Which class crosses which interface is each detector's own rule, and each declares it
(``Detector.unseen_without``: interface -> what a reader would miss; docs/ADDING_A_DETECTOR.md): e.g.
tuple_collision.py acts on the challenge ACK on eth0 (on lo it reads only the app's REDIRECTed SYNs),
conntrack_invalid.py returns at once on lo (the REDIRECT is in PREROUTING: only what arrives on eth0 can miss it),
upstream_refused.py and startup_ordering.py act on lo alone. This module reads the run's loaded detectors'
declarations, passed in (``missed_by``); it knows no detector.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from .detector import Detector

ROLES = ("lo", "eth0")
# The order the report has listed the built-in classes in (scripts may read ``not_seen`` by position): a class of
# a detector not named here follows them, in the order the detectors were loaded. Order only: what each class is
# and where it crosses is its detector's declaration.
LISTED_FIRST = ("tuple-collision", "syn-timeout", "tls-mismatch", "conntrack-invalid", "shutdown-ordering",
                "upstream-refused", "startup-ordering", "http-framing", "server-first-protocol", "stale-keepalive")


@dataclass(frozen=True, slots=True)
class Missed:
    """A failure class whose packets cross ``iface`` (lo or eth0) only: a run without that interface's packets
    misses ``what`` (a few words), the class of ``detector`` (its id)."""

    detector: str
    iface: str
    what: str


def missed_by(detectors: Iterable[Detector]) -> tuple[Missed, ...]:
    """The classes ``detectors`` (a run's, in load order) declare in ``unseen_without``, those of LISTED_FIRST's
    ids first in its order, then the others in load order. An interface other than lo and eth0 is left out: no
    report could say it missing (tests/core/test_unseen_declared.py holds the built-ins to ROLES)."""
    out = [Missed(det.id, iface, what) for det in detectors for iface, what in det.unseen_without.items()
           if iface in ROLES]
    rank = {d: i for i, d in enumerate(LISTED_FIRST)}
    return tuple(sorted(out, key=lambda m: rank.get(m.detector, len(rank))))  # stable: load order among the rest


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


def unseen(by_iface: dict[str, int], missed: Iterable[Missed]) -> list[Unseen]:
    """For the interfaces packets came from (``by_iface``: ``lo``/``eth0``, or ``pod/lo`` with several pods, ->
    packets analysed), each pod that had packets from one of lo and eth0 and none from the other, with the classes
    of ``missed`` (the run's detectors' declarations, ``missed_by``) only the other shows. A pod with neither (no
    packet at all) or both is not listed, nor one whose missing interface no loaded detector reads a class on;
    other interfaces (``any``, a stem) say nothing of either."""
    pods: dict[str | None, set[str]] = {}
    for key, packets in by_iface.items():
        pod, _, iface = key.rpartition("/")
        if packets and iface in ROLES:
            pods.setdefault(pod or None, set()).add(iface)
    declared = tuple(missed)
    classes = {iface: tuple((m.detector, m.what) for m in declared if m.iface == iface) for iface in ROLES}
    out: list[Unseen] = []
    for pod, seen in pods.items():
        if len(seen) == 1:
            missing = "eth0" if seen == {"lo"} else "lo"
            if classes[missing]:
                out.append(Unseen(pod, missing, classes[missing]))
    return out
