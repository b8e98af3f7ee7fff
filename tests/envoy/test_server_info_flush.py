"""Envoy's file flush interval from /server_info (command_line_options.file_flush_interval, a protobuf
Duration in JSON): the time a watch follows the sidecar's log after its capture stopped."""

from __future__ import annotations

import json

import pytest

from kubectl_meshdoctor.envoy.server_info import file_flush_interval_s


def _info(value) -> str:
    return json.dumps({"version": "x/1.40.0/Clean/RELEASE/BoringSSL", "command_line_options": {
        "file_flush_interval": value, "concurrency": 2}})


@pytest.mark.parametrize("value, seconds", [("1s", 1.0), ("0.100s", 0.1), ("10s", 10.0), ("1.5s", 1.5),
                                            ("0s", 0.0), ("0.000001s", 0.000001)])
def test_a_duration_as_envoy_writes_it(value, seconds):
    assert file_flush_interval_s(_info(value)) == pytest.approx(seconds)


@pytest.mark.parametrize("body", [_info(None), _info(1000), _info("1000ms"), _info("-1s"), _info("s"),
                                  json.dumps({"version": "x/1.40.0"}), "[]", "not json", "[" * 100_000,
                                  json.dumps({"command_line_options": []})])
def test_no_interval_or_a_bad_one_is_none_never_a_raise(body):
    assert file_flush_interval_s(body) is None
