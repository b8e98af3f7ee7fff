"""A 5xx that no upstream answered and no response flag names (core/correlate.py envoys_own_5xx): the sidecar's
own local reply, read in the formats that write it."""

import pytest

from kubectl_meshdoctor.core.correlate import envoys_own_5xx
from kubectl_meshdoctor.envoy.access_log import parse_line

# Envoy's default format (Istio 1.0 set none): istio/istio#8692's line, Mixer's 503
DEFAULT = ('[2018-09-13T18:35:26.254Z] "GET /productpage HTTP/1.1" {code} {flags} 0 33 1 - "10.21.209.4" "curl/7.29.0" '
           '"973b114c-d60d-92c5-ac82-a25b32d00e59" "hide.test.com" "{host}"')
# Istio 1.23's TEXT format, details after the flags
ISTIO = ('[2026-12-04T05:46:44.705Z] "GET /a HTTP/1.1" {code} {flags} {details} - "-" 0 91 3 - "-" "curl/8" "5b5c" '
         '"svc:80" "{host}" inbound|80|| 127.0.0.6:4000 198.18.2.2:80 198.18.2.1:39884 - default')


@pytest.mark.parametrize("line, own", [
    (DEFAULT.format(code=503, flags="-", host="-"), True),
    (DEFAULT.format(code=500, flags="-", host="-"), True),
    (DEFAULT.format(code=503, flags="-", host="10.0.0.7:9080"), False),  # an upstream answered it
    (DEFAULT.format(code=503, flags="UF", host="-"), False),  # a flag names it: its detectors' story
    (DEFAULT.format(code=404, flags="-", host="-"), False),  # not a 5xx
    (ISTIO.format(code=503, flags="-", details="ext_authz_error", host="-"), True),
    (ISTIO.format(code=503, flags="-", details="direct_response", host="-"), True),
    (ISTIO.format(code=503, flags="-", details="via_upstream", host="-"), False),
    (ISTIO.format(code=503, flags="-", details="via_upstream", host="127.0.0.1:80"), False),
])
def test_a_5xx_with_no_flag_and_no_upstream_is_the_sidecars_own(line, own):
    entry = parse_line(line)
    assert entry is not None and envoys_own_5xx(entry) is own
