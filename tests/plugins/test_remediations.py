"""Every fix a finding offers is YAML that parses: it is meant to be pasted into kubectl apply."""

import pytest
import yaml

from kubectl_meshdoctor.core.fixes import render
from kubectl_meshdoctor_plugins import (
    http_framing,
    source_port_exhaustion,
    stale_keepalive,
    syn_timeout,
    tuple_collision,
    upstream_refused,
)


@pytest.mark.parametrize("text", [
    render(http_framing.FIXES, http_framing.NOTE), render(stale_keepalive.fixes(5.0), stale_keepalive.RETRY_NOTE),
    render(stale_keepalive.fixes(None)), render(stale_keepalive.CALLER_FIXES),
    render(source_port_exhaustion.FIXES), syn_timeout._REMEDIATION,
    render(tuple_collision.fixes(5002)), render(upstream_refused.fixes(5000, "unknown")),
])
def test_remediation_is_valid_yaml_with_kinds(text):
    docs = [d for d in yaml.safe_load_all(text) if d]  # a fix in the app's own code is comments only
    assert docs or all(line.startswith("#") for line in text.splitlines() if line.strip() != "---")
    for d in docs:
        assert "kind" in d or "metadata" in d or "spec" in d
