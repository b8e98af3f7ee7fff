"""The envoy package's public names (what docs/ADDING_A_DETECTOR.md lets an outside detector import) resolve to
their modules' objects, and importing the package loads none of its parsers until one is used."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys

import kubectl_meshdoctor.envoy as envoy


def test_every_public_name_is_its_modules_object():
    assert len(envoy.__all__) == 31
    for name in envoy.__all__:
        home = importlib.import_module(f"kubectl_meshdoctor.envoy.{envoy._HOME[name]}")
        assert getattr(envoy, name) is getattr(home, name)
    namespace: dict = {}
    exec("from kubectl_meshdoctor.envoy import *", namespace)
    assert set(envoy.__all__) <= set(namespace)


def test_a_name_it_does_not_have_is_an_attribute_error():
    try:
        envoy.parse_nothing
    except AttributeError as e:
        assert "parse_nothing" in str(e)
    else:
        raise AssertionError("no AttributeError")


def test_importing_the_package_or_the_capture_reader_loads_only_what_they_use():
    probe = ("import sys, kubectl_meshdoctor.envoy\n"
             "print(sorted(m for m in sys.modules if m.startswith('kubectl_meshdoctor.envoy.')))\n"
             "import kubectl_meshdoctor.sources.reader_process\n"
             "print(sorted(m for m in sys.modules if m.startswith('kubectl_meshdoctor.envoy.')))\n")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True,
                         timeout=60).stdout.splitlines()
    assert out[0] == "[]"
    loaded = set(ast.literal_eval(out[1]))
    assert "kubectl_meshdoctor.envoy.access_log" in loaded  # core/events.py's AccessLogEvent holds its entry
    assert not loaded & {f"kubectl_meshdoctor.envoy.{m}" for m in ("clusters", "stats", "logging", "server_info")}
