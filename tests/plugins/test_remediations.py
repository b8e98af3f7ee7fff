"""Every fix a finding offers is YAML that parses: it is meant to be pasted into kubectl apply."""

import pytest
import yaml

from kubectl_meshdoctor_plugins import http_framing, stale_keepalive, syn_timeout, tuple_collision, upstream_refused


@pytest.mark.parametrize("text", [
    http_framing._REMEDIATION, stale_keepalive._REMEDIATION, syn_timeout._REMEDIATION,
    tuple_collision._remediation(5002), upstream_refused._remediation(5000),
])
def test_remediation_is_valid_yaml_with_kinds(text):
    docs = [d for d in yaml.safe_load_all(text) if d]
    assert docs
    for d in docs:
        assert "kind" in d or "metadata" in d or "spec" in d
