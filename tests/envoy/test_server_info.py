import json

import pytest

from kubectl_meshdoctor.envoy.clusters import FormatError
from kubectl_meshdoctor.envoy.server_info import envoy_version, version_tuple

# Trimmed GET /server_info body (envoy.admin.v3.ServerInfo); only `version` matters here.
SERVER_INFO = json.dumps({
    "version": "6c72b2179f5a58988b920a55b0be8346de3f7b35/1.33.2/Clean/RELEASE/BoringSSL",
    "state": "LIVE", "hot_restart_version": "11.104", "command_line_options": {"concurrency": 2},
    "node": {"id": "sidecar~10.244.1.23~orders-7d9.shop~shop.svc.cluster.local"},
    "uptime_current_epoch": "3600s", "uptime_all_epochs": "3600s",
}, indent=1)


def test_version_from_server_info():
    assert envoy_version(SERVER_INFO) == "1.33.2"
    assert envoy_version(json.loads(SERVER_INFO)) == "1.33.2"
    assert envoy_version('{"version": "abc/1.34.0-dev/Modified/DEBUG/BoringSSL-FIPS"}') == "1.34.0"
    assert version_tuple("1.33.2") == (1, 33, 2) and version_tuple("1.9.10") > version_tuple("1.9.2")


@pytest.mark.parametrize("body", ["<html/>", "{}", '{"version": 3}', '{"version": "abc/dev/Clean"}', "[]"])
def test_bad_bodies(body):
    with pytest.raises(FormatError) as info:
        envoy_version(body)
    assert "\n" not in str(info.value)
