"""lint's reading of a pod's start for the detectors (lint/sidecar.py pod_event): how the spec holds the app, and
istio-proxy's restarts and start time, on the reference pods of tests/lint/data."""

from __future__ import annotations

import copy

import pytest

from .test_rules import pod


@pytest.mark.parametrize("name, hold, app_after_s", [
    ("classic", "", 0.0), ("classic-fixed", "postStart pilot-agent wait", 0.0), ("native", "native sidecar", 2.0)])
def test_pod_event_says_how_the_app_waits_for_its_sidecar(name, hold, app_after_s):
    from kubectl_meshdoctor.lint.sidecar import pod_event

    spec = pod(name)
    ev = pod_event(spec, 1.0)
    assert ev.hold == hold and ev.restarts == 0 and ev.sidecar_restarts == 0
    assert ev.app_started - ev.sidecar_started == app_after_s  # the reference pods' startedAt, seconds apart
    restarted = copy.deepcopy(spec)
    for key in ("initContainerStatuses", "containerStatuses"):
        for st in restarted["status"].get(key) or []:
            if st["name"] == "istio-proxy":
                st["restartCount"] = 2
    assert pod_event(restarted, 1.0).sidecar_restarts == 2 and pod_event(restarted, 1.0).restarts == 0
    del restarted["spec"]["containers"][:]  # no app container, no sidecar: nothing holds, nothing started
    del restarted["spec"]["initContainers"][:]
    assert pod_event(restarted, 1.0).hold is None
