"""The `load` lab pod: steady keep-alive traffic on the pod's lo and eth0 (what bench/live drives at 20k packets/s).

Behaviour only, never speed: every request is answered 200 on each of the three paths (through the sidecar, straight
to the app on eth0, on lo from 127.0.0.6), the sidecar logs only the requests it carried, and the generator stops
at its request cap and at its time limit. The fast app and the address guard need no lab.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from typing import Iterator

import pytest

from meshdoctor_lab import lab
from meshdoctor_lab.apps import FAST_RESPONSE, FastHttpApp
from meshdoctor_lab.scenarios import LOAD_DIRECT_PORT, LOAD_PATHS, run_load
from meshdoctor_lab.state import LabPod, LabState
from tests.lab.local_servers import free_port
from tests.lab.test_lab_network import _require_lab_host

from ..waiting import wait_until, wait_until_async
from .lab_names import lab_name


@pytest.fixture(scope="module")
def load_lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LabState]:
    _require_lab_host()
    name = lab_name("", 8)
    state_dir = tmp_path_factory.mktemp("lab") / name
    state = lab.up(name=name, state_dir=state_dir, pods=("load",), apiserver=False, drivers=False)
    try:
        yield state
    finally:
        lab.down(state_dir)


def _run_load_in_client_ns(state: LabState, **kwargs) -> dict:
    """run_load(pod, **kwargs) in the pod's client namespace (where it must run); its LoadResult as JSON."""
    pod = state.pod("load")
    code = ("import json, sys\n"
            "from meshdoctor_lab.scenarios import run_load\n"
            "from meshdoctor_lab.state import LabPod\n"
            "pod = LabPod.from_json(json.loads(sys.argv[1]))\n"
            "print(json.dumps(run_load(pod, **json.loads(sys.argv[2])).to_json()))\n")
    out = subprocess.run(["ip", "netns", "exec", pod.client_netns, sys.executable, "-c", code,
                          json.dumps(pod.to_json()), json.dumps(kwargs)],
                         capture_output=True, text=True, timeout=60, check=True).stdout
    return json.loads(out.splitlines()[-1])


@pytest.mark.lab
def test_load_round_gets_200s_on_every_path_and_the_sidecar_logs_only_its_own(load_lab: LabState) -> None:
    result = lab.trigger_round(load_lab, "load")
    load = result.load
    assert result.errors == ()
    assert load is not None and load["stopped_by"] == "time"
    assert result.http_ok == load["ok"] == load["sent"] > 0
    assert set(load["by_path"]) == set(LOAD_PATHS)
    for path, counts in load["by_path"].items():
        assert counts["ok"] == counts["sent"] > 0, path
        assert counts["lost"] == 0, path
    # Packets moved where each path puts them: lo (sidecar's upstream leg and the lo path) and eth0 both ways.
    assert load["packets"]["lo"] > 0 and load["packets"]["eth0_rx"] > 0 and load["packets"]["eth0_tx"] > 0
    path = lab.access_log_path(load_lab, "load")

    def carried() -> list[str]:  # the sidecar logs a request after answering it: wait for the last lines
        return [line for line in path.read_text().splitlines() if '"GET /load HTTP/1.1" 200' in line]

    wait_until("the sidecar logged the requests it carried", 10,
               lambda: len(carried()) >= load["by_path"]["sidecar"]["sent"])
    assert len(carried()) == load["by_path"]["sidecar"]["sent"]  # the direct paths never cross the sidecar
    assert not [line for line in path.read_text().splitlines() if f":{LOAD_DIRECT_PORT}" in line]


@pytest.mark.lab
def test_run_load_stops_at_its_request_cap(load_lab: LabState) -> None:
    load = _run_load_in_client_ns(load_lab, rate_pps=2000.0, seconds=5.0, max_requests=100)
    assert load["stopped_by"] == "count"
    assert load["sent"] == load["ok"] == 100
    assert load["errors"] == []


@pytest.mark.lab
def test_run_load_stops_at_its_time_limit(load_lab: LabState) -> None:
    load = _run_load_in_client_ns(load_lab, rate_pps=1000.0, seconds=0.5)
    assert load["stopped_by"] == "time"
    # Its own clock: the send loop ends at the limit (answers in flight then get at most a second).
    assert 0.5 <= load["ended"] - load["started"] < 1.5
    assert 0 < load["sent"] <= 1000 * 0.5


@pytest.mark.parametrize("pod_ip, client_ip", [("10.0.0.2", "198.18.1.1"), ("198.18.1.2", "192.168.1.1"),
                                               ("198.20.0.2", "198.18.1.1")])
def test_run_load_refuses_addresses_outside_the_lab_network(pod_ip: str, client_ip: str) -> None:
    pod = LabPod("load", "load", "no-such-netns", "", pod_ip, client_ip, (), "")
    with pytest.raises(ValueError, match="not a lab address"):
        run_load(pod, 100.0, 1.0)


@pytest.mark.parametrize("kwargs", [{"rate_pps": 0.0}, {"rate_pps": 1e9}, {"seconds": 0.0}, {"seconds": 1e6},
                                    {"sidecar_share": 1.5}, {"connections": 0}, {"connections": 1000}])
def test_run_load_refuses_limits_out_of_range(kwargs: dict) -> None:
    pod = LabPod("load", "load", "no-such-netns", "", "198.18.1.2", "198.18.1.1", (), "")
    args = {"rate_pps": 100.0, "seconds": 1.0, **kwargs}
    with pytest.raises(ValueError, match="out of range|not within"):
        run_load(pod, args.pop("rate_pps"), args.pop("seconds"), **args)


def test_fast_app_answers_every_pipelined_request_and_closes_on_connection_close() -> None:
    async def scenario() -> tuple[bytes, bytes, bytes]:
        port, other = free_port(), free_port()
        task = asyncio.create_task(FastHttpApp("127.0.0.1", (port, other)).serve_forever())
        try:
            async def connect() -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
                try:
                    return await asyncio.open_connection("127.0.0.1", port)
                except OSError:  # refused: not listening yet
                    return None

            reader, writer = await wait_until_async("the fast app listening", 2, connect)
            request = b"GET /a HTTP/1.1\r\nHost: x\r\n\r\n"
            writer.write(request * 2 + request[:10])  # two whole requests and the start of a third
            two = await asyncio.wait_for(reader.readexactly(2 * len(FAST_RESPONSE)), 2)
            writer.write(request[10:])
            third = await asyncio.wait_for(reader.readexactly(len(FAST_RESPONSE)), 2)
            writer.close()
            reader2, writer2 = await asyncio.open_connection("127.0.0.1", other)  # the second port answers too
            writer2.write(b"GET /b HTTP/1.1\r\nHost: x\r\nConnection: Close\r\n\r\n")
            closing = await asyncio.wait_for(reader2.read(), 2)  # read() to EOF: the app closed
            writer2.close()
            return two, third, closing
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    two, third, closing = asyncio.run(scenario())
    assert two == FAST_RESPONSE * 2
    assert third == FAST_RESPONSE
    assert closing.startswith(b"HTTP/1.1 200 OK\r\n") and b"Connection: close" in closing
