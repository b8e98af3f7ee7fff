"""`analyze DIR...` and `FILE:POD/IFACE`: each pod's files through a pipeline of its own (issue 31). Two pods'
eth0 captures of the same connections are two views, not one flow: read together they invented findings. Real
lab recordings and real Envoy logs, copied under names that say nothing of their interface; a second pod's view
of the same connections is the recording shifted in time by editcap (as a caller sees a server's packets
a little earlier or later)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

DATA = Path(__file__).resolve().parent.parent / "data"
pytestmark = pytest.mark.skipif(shutil.which("tshark") is None or shutil.which("editcap") is None,
                                reason="captures are read through tshark; editcap converts them")


def run(*args: str, output: str = "json") -> tuple[int, dict | str, str]:
    proc = subprocess.run([sys.executable, "-m", "kubectl_meshdoctor", "analyze", *args, "-o", output],
                          capture_output=True, text=True, timeout=300)
    out = json.loads(proc.stdout) if output == "json" and proc.stdout else proc.stdout
    return proc.returncode, out, proc.stderr


def pod_dir(root: Path, pod: str, files: dict[str, str], shift: str | None = None) -> Path:
    """Directory ``root/pod`` holding recordings ``files`` (new name -> name in tests/data); a name ending
    in .pcapng is converted by editcap, and captures are shifted by ``shift`` seconds when given."""
    d = root / pod
    d.mkdir()
    for name, src in files.items():
        if src.endswith(".pcap"):
            cmd = ["editcap", *(["-F", "pcapng"] if name.endswith(".pcapng") else []),
                   *(["-t", shift] if shift else []), str(DATA / src), str(d / name)]
            subprocess.run(cmd, check=True, capture_output=True)
        else:
            shutil.copy(DATA / src, d / name)
    return d


def alike(f: dict) -> tuple:
    """A finding as two runs over the same frames must both give it: not its file names."""
    return (f["detector"], f["severity"], f["title"], json.dumps(f["flow"]), tuple(f.get("access_log", ())),
            tuple((e["iface"], e["frame"], e["what"]) for e in f["evidence"]))


FRAMING = {"a.pcap": "lab-framing-mixed-lo.pcap", "b.pcapng": "lab-framing-mixed-eth0.pcap",
           "proxy.txt": "lab-framing-mixed-access.log"}
COLLISION = {"x.pcap": "lab-collision-lo.pcap", "y.pcapng": "lab-collision-eth0.pcap"}


def test_two_copies_of_a_pod_in_two_directories_give_each_pods_findings_as_alone(tmp_path):
    reviews = pod_dir(tmp_path, "reviews", FRAMING)
    ratings = pod_dir(tmp_path, "ratings", {"c.pcap": FRAMING["a.pcap"], "d.pcapng": FRAMING["b.pcapng"],
                                            "envoy.txt": FRAMING["proxy.txt"]})
    code, alone, _ = run(*(str(DATA / n) for n in FRAMING.values()))
    assert code == 1 and alone["findings"]
    code, both, err = run(str(reviews), str(ratings))
    assert code == 1, err
    assert both["source"]["pods"] == ["reviews", "ratings"]
    for pod in ("reviews", "ratings"):
        own = [f for f in both["findings"] if f.get("pod") == pod]
        assert Counter(map(alike, own)) == Counter(map(alike, alone["findings"]))
    assert len(both["findings"]) == 2 * len(alone["findings"])  # every finding names its pod
    assert set(both["stats"]["interfaces"]) == {"reviews/lo", "reviews/eth0", "ratings/lo", "ratings/eth0"}
    entry = both["source"]["per_pod"][0]
    assert entry["pod"] == "reviews" and entry["interfaces"] == {str(reviews / "a.pcap"): "lo",
                                                                 str(reviews / "b.pcapng"): "eth0"}
    assert entry["kinds"][str(reviews / "proxy.txt")] == "envoy-log"
    assert set(both["envoy"]["per_pod"]) == {"reviews", "ratings"}


def test_two_pods_eth0_views_of_one_connection_invent_nothing(tmp_path):
    server = pod_dir(tmp_path, "server", COLLISION)
    caller = pod_dir(tmp_path, "caller", COLLISION, shift="0.0003")
    each = {}
    for pod, d in (("server", server), ("caller", caller)):
        code, report, err = run(str(d))
        assert code == 1, err
        assert all(f["pod"] == pod for f in report["findings"])
        each[pod] = Counter(map(alike, report["findings"]))
    code, both, err = run(str(server), str(caller))
    assert code == 1, err
    got = {pod: Counter(alike(f) for f in both["findings"] if f["pod"] == pod) for pod in each}
    assert got == each and sum(map(len, got.values())) == len(both["findings"])
    assert not any(f["detector"] == "syn-timeout" or f["severity"] == "warning" for f in both["findings"])


def test_file_pod_iface_names_one_files_pod_and_interface(tmp_path):
    caller = pod_dir(tmp_path, "caller", COLLISION)
    shutil.copy(DATA / "lab-framing-mixed-lo.pcap", tmp_path / "capture-17.pcap")
    code, report, err = run(str(caller), f"{tmp_path / 'capture-17.pcap'}:server/lo")
    assert code == 1, err
    assert report["source"]["pods"] == ["caller", "server"]
    assert report["source"]["per_pod"][1]["interfaces"] == {str(tmp_path / "capture-17.pcap"): "lo"}
    assert {f["pod"] for f in report["findings"] if f["detector"] == "http-framing"} == {"server"}
    assert {f["pod"] for f in report["findings"] if f["detector"] == "tuple-collision"} == {"caller"}
    # FILE:POD/ gives the pod alone: the interface comes from the content, as for a file of a directory.
    code, again, _ = run(f"{tmp_path / 'capture-17.pcap'}:server/")
    assert again["source"]["per_pod"][0]["interfaces"] == {str(tmp_path / "capture-17.pcap"): "lo"}
    assert Counter(map(alike, again["findings"])) == Counter(
        alike(f) for f in report["findings"] if f["pod"] == "server")


def test_a_plain_file_beside_pod_directories_is_its_directorys_pod(tmp_path):
    caller = pod_dir(tmp_path, "caller", COLLISION)
    server = tmp_path / "server"
    server.mkdir()
    shutil.copy(DATA / "lab-framing-mixed-lo.pcap", server / "lo.pcap")
    code, report, _ = run(str(caller), str(server / "lo.pcap"))
    assert report["source"]["pods"] == ["caller", "server"]
    assert "server/lo" in report["stats"]["interfaces"]


def test_the_text_report_names_each_pod_and_what_was_read_as_whose(tmp_path):
    server = pod_dir(tmp_path, "server", COLLISION)
    caller = pod_dir(tmp_path, "caller", COLLISION, shift="0.0003")
    _, text, _ = run(str(server), str(caller), output="text")
    assert f"pod/server: {server / 'x.pcap'} (lo), {server / 'y.pcapng'} (eth0)" in text
    # a third file (a /clusters dump): the directory is named once
    shutil.copy(DATA / "envoy-1.40-mesh" / "refused" / "server" / "clusters.txt", server)
    _, text, _ = run(str(server), str(caller), output="text")
    assert f"pod/server (in {server}/): clusters.txt (clusters), x.pcap (lo), y.pcapng (eth0)" in text
    assert "ERROR tuple-collision [UC,UF,URX] pod/caller:" in text
    assert "ERROR tuple-collision [UC,UF,URX] pod/server:" in text
    _, md, _ = run(str(server), str(caller), output="markdown")
    assert "| pod/caller 198.18.1.2:5002 |" in md


@pytest.mark.parametrize("case", ["empty", "same-name"])
def test_a_bad_pod_argument_is_one_line_and_exit_2(tmp_path, case):
    if case == "empty":
        (tmp_path / "caller").mkdir()
        args, said = [str(tmp_path / "caller")], "no file in it"
    else:
        one, two = pod_dir(tmp_path, "caller", COLLISION), tmp_path / "other"
        two.mkdir()
        pod_dir(two, "caller", COLLISION)
        args, said = [str(one), str(two / "caller")], "would both be pod caller"
    code, out, err = run(*args)
    assert code == 2 and not out and err.count("\n") == 1 and said in err and "Traceback" not in err


MESH = DATA / "envoy-1.40-mesh" / "refused"


@pytest.mark.parametrize("wrap", ["[pod/{pod}/istio-proxy] {line}", "{pod} istio-proxy {line}"],
                         ids=["kubectl-prefix", "stern"])
def test_a_several_pods_log_beside_pod_directories_keeps_its_lines_with_the_pods_it_names(tmp_path, wrap):
    """`kubectl logs -l app=x -c istio-proxy --prefix > all.log` (or stern's) beside the pods' directories: each
    line is read with the files of the pod it names, so the hop join finds both sidecars' lines."""
    lines = []
    for pod in ("caller", "server"):
        d = tmp_path / pod
        d.mkdir()
        for f in (MESH / pod).iterdir():
            if f.name != "istio-proxy.log":
                shutil.copy(f, d / f.name)
        lines += [wrap.format(pod=pod, line=line) for line in (MESH / pod / "istio-proxy.log").read_text().splitlines()]
    (tmp_path / "all.log").write_text("\n".join(lines) + "\n")
    code, whole, _ = run(str(MESH / "caller"), str(MESH / "server"))
    code2, split, err = run(str(tmp_path / "caller"), str(tmp_path / "server"), str(tmp_path / "all.log"))
    assert (code2, split["source"]["pods"]) == (code, ["caller", "server"]), err
    def story(f: dict) -> tuple:
        return f["detector"], f["pod"], f["title"], tuple((e["kind"], e["frame"], e["what"]) for e in f["evidence"])

    assert whole["findings"] and Counter(map(story, split["findings"])) == Counter(map(story, whole["findings"]))
    per_pod = {p["pod"]: p["files"] for p in split["source"]["per_pod"]}
    assert all(str(tmp_path / "all.log") in per_pod[p] for p in ("caller", "server"))
    # Each pod counts its own lines of the shared file, as it counts its own log read alone, not the whole file.
    for pod in ("caller", "server"):
        assert split["envoy"]["per_pod"][pod]["log_lines"] == whole["envoy"]["per_pod"][pod]["log_lines"], pod
    # Alone, the file is the two pods it names.
    _, alone, _ = run(str(tmp_path / "all.log"))
    assert alone["source"]["pods"] == ["caller", "server"]


def test_what_a_directory_holds_that_is_no_file_is_in_the_report_and_the_run_goes_on(tmp_path):
    caller = pod_dir(tmp_path, "caller", COLLISION)
    (caller / "loop").symlink_to("loop")
    (caller / "gone").symlink_to("nowhere")
    (caller / "more").mkdir()
    os.mkfifo(caller / "pipe")
    (tmp_path / "self").symlink_to("self")
    code, report, err = run(str(caller), str(tmp_path / "self") + "/")
    assert code == 1 and "Traceback" not in err, err
    where = {p["where"]: p["what"] for p in report["problems"]}
    assert {Path(w).name for w in where} >= {"loop", "gone", "more", "pipe", "self"}
    assert any(f["detector"] == "tuple-collision" for f in report["findings"])


@pytest.mark.parametrize("arg", ["{f}:server", "{f}:server/caller"])
def test_a_pod_given_where_an_interface_goes_is_one_line_and_exit_2(tmp_path, arg):
    shutil.copy(DATA / "lab-collision-lo.pcap", tmp_path / "x.pcap")
    code, out, err = run(arg.format(f=tmp_path / "x.pcap"))
    assert code == 2 and not out and err.count("\n") == 1 and f"{tmp_path / 'x.pcap'}:server/" in err
