"""A kubeconfig is outside text too: every value the client reads from it (contexts, clusters, users, the
namespace, certificate data, the server URL) may be of the wrong type or shape. `connect` returns a client or
raises its one documented error, KubeError (one line), never anything else (issue 15)."""

import base64
import copy

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kubectl_meshdoctor.kube.client import KubeError, KubeOptions, connect

FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                        HealthCheck.function_scoped_fixture])

GOOD = {
    "apiVersion": "v1", "kind": "Config", "current-context": "x",
    "clusters": [{"name": "c", "cluster": {"server": "https://198.18.0.1:6443",
                                           "certificate-authority-data": base64.b64encode(b"not a cert").decode()}}],
    "users": [{"name": "u", "user": {"token": "x", "client-certificate-data": "Zm9v", "client-key-data": "YmFy"}}],
    "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u", "namespace": "shop"}}],
}
# Where a value sits: (key path into GOOD). Each may be replaced by any YAML value.
PATHS = [(), ("current-context",), ("clusters",), ("clusters", 0), ("clusters", 0, "name"), ("clusters", 0, "cluster"),
         ("clusters", 0, "cluster", "server"), ("clusters", 0, "cluster", "certificate-authority-data"),
         ("users",), ("users", 0), ("users", 0, "user"), ("users", 0, "user", "token"),
         ("users", 0, "user", "client-certificate-data"), ("users", 0, "user", "client-key-data"),
         ("contexts",), ("contexts", 0), ("contexts", 0, "name"), ("contexts", 0, "context"),
         ("contexts", 0, "context", "namespace"), ("contexts", 0, "context", "cluster"),
         ("contexts", 0, "context", "user")]

yaml_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20)
    | st.sampled_from(["²", "9" * 5000, "://", "http://[::1", "https://198.18.0.1:99999", "=" * 7, "-"]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=10)


@st.composite
def kubeconfigs(draw) -> object:
    doc = copy.deepcopy(GOOD)
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(PATHS))
        value = draw(yaml_values)
        if not path:
            return value
        node = doc
        try:
            for key in path[:-1]:
                node = node[key]
            node[path[-1]] = value
        except (KeyError, IndexError, TypeError):
            pass  # an earlier change removed the place
    return doc


@FUZZ
@given(doc=kubeconfigs(), context=st.none() | st.sampled_from(["x", "nope"]))
def test_connect_returns_a_client_or_raises_kube_error(tmp_path_factory, doc, context):
    kc = tmp_path_factory.mktemp("kc") / "config"
    kc.write_text(yaml.safe_dump(doc))
    try:
        kube = connect(KubeOptions(str(kc), context))
    except KubeError as e:
        assert str(e) and "\n" not in str(e)
        return
    assert isinstance(kube.namespace, str) and kube.namespace
