"""analyze's arguments as pods (sources/pod_inputs.py), on a real file system: what a DIR holds that is no file
(a link loop, a link to nothing, a FIFO, a subdirectory) is said and the rest read; a FIFO is never opened;
``FILE:WORD`` with a word that is no interface teaches ``FILE:POD/``; two directories of one name are refused
however the name is given; a folder of pod folders is its pods. Issue 31."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from kubectl_meshdoctor.sources.files import CaptureArg, InputError
from kubectl_meshdoctor.sources.pod_inputs import by_pod, pod_inputs

DATA = Path(__file__).resolve().parent.parent / "data"


def _pod(root: Path, name: str, *files: str) -> Path:
    d = root / name
    d.mkdir(parents=True)
    for f in files:
        (d / f).write_bytes((DATA / "lab-collision-lo.pcap").read_bytes())
    return d


def test_what_a_dir_holds_that_is_no_file_is_said_one_line_each_and_the_rest_read(tmp_path):
    caller = _pod(tmp_path, "caller", "lo.pcap")
    (caller / "loop1").symlink_to("loop2")
    (caller / "loop2").symlink_to("loop1")
    (caller / "dangling").symlink_to("nowhere")
    (caller / "sub").mkdir()
    os.mkfifo(caller / "fifo")
    server = _pod(tmp_path, "server", "eth0.pcap")
    got = pod_inputs([str(caller), str(server)])
    assert [(Path(a.path).name, a.pod) for a in got.files] == [("lo.pcap", "caller"), ("eth0.pcap", "server")]
    said = {Path(p.where).name: p.what for p in got.skipped}
    assert set(said) == {"loop1", "loop2", "dangling", "sub", "fifo"}
    assert "link loop" in said["loop1"] and "link to nothing (nowhere)" in said["dangling"]
    assert "pipe" in said["fifo"] and "directory" in said["sub"]
    assert all("\n" not in p.line() for p in got.skipped)


def test_a_fifo_in_a_dir_is_never_opened(tmp_path):
    caller = _pod(tmp_path, "caller", "lo.pcap")
    os.mkfifo(caller / "fifo")
    opened = threading.Event()

    def writer() -> None:  # blocks until someone opens the FIFO for reading; we open it ourselves at the end
        with open(caller / "fifo", "wb"):
            opened.set()

    t = threading.Thread(target=writer, daemon=True)
    t.start()
    pod_inputs([str(caller)])
    assert not opened.is_set()
    with open(caller / "fifo", "rb"):  # let the writer go
        pass
    t.join(timeout=5)
    assert opened.is_set()


@pytest.mark.parametrize("loop", ["as-dir", "as-dir-slash", "as-file"])
def test_a_link_loop_given_as_an_argument_is_one_problem_and_the_rest_is_read(tmp_path, loop):
    server = _pod(tmp_path, "server", "eth0.pcap")
    (tmp_path / "self").symlink_to("self")
    arg = str(tmp_path / "self") + ("/" if loop == "as-dir-slash" else "")
    got = pod_inputs([arg, str(server)])
    assert [a.pod for a in got.files] == ["server"]
    assert [p.line() for p in got.skipped] == [f"{arg}: a symbolic link loop: not read"]
    with pytest.raises(InputError, match="link loop"):
        pod_inputs([arg])


@pytest.mark.parametrize("arg, pod", [("x.pcap:server", "server"), ("x.pcap:caller-7d9/server", "caller-7d9"),
                                      ("x.pcap:productpage", "productpage")])
def test_a_word_that_is_no_interface_teaches_the_pod_form(tmp_path, arg, pod):
    with pytest.raises(InputError) as e:
        pod_inputs([str(tmp_path / arg)])
    said = str(e.value)
    assert "\n" not in said and "is no interface name" in said and f"x.pcap:{pod}/" in said


def test_interface_words_and_the_pod_form_still_parse(tmp_path):
    assert CaptureArg.parse("x.pcap:eth0") == CaptureArg("x.pcap", "eth0", explicit=True)
    assert CaptureArg.parse("x.pcap:server/lo") == CaptureArg("x.pcap", "lo", explicit=True, pod="server")
    assert CaptureArg.parse("x.pcap:server/").pod == "server"
    assert CaptureArg.parse("x.pcap:server/").explicit is False


def test_two_directories_of_one_name_are_refused_however_the_name_comes(tmp_path):
    one = _pod(tmp_path / "a", "caller", "lo.pcap")
    two = _pod(tmp_path / "b", "caller", "eth0.pcap")
    for args in ([str(one), str(two)], [str(one), str(two / "eth0.pcap")],
                 [str(_pod(tmp_path / "c", "server", "x.pcap")), str(one / "lo.pcap"), str(two / "eth0.pcap")]):
        with pytest.raises(InputError, match="would both be pod caller"):
            pod_inputs(args)


def test_a_name_the_user_gives_joins_the_pod_of_that_name(tmp_path):
    caller = _pod(tmp_path / "a", "caller", "lo.pcap")
    other = _pod(tmp_path / "b", "x", "capture.pcap")
    got = pod_inputs([str(caller), f"{other / 'capture.pcap'}:caller/eth0"])
    assert [(a.pod, a.iface) for a in got.files] == [("caller", "lo"), ("caller", "eth0")]
    assert [pod for pod, _ in by_pod(got.files)] == ["caller"]


def test_a_file_of_a_dir_given_a_pod_of_its_own_is_that_pods_only(tmp_path):
    caller = _pod(tmp_path, "caller", "lo.pcap", "eth0.pcap")
    got = pod_inputs([str(caller), f"{caller / 'eth0.pcap'}:server/"])
    assert [(Path(a.path).name, a.pod) for a in got.files] == [("lo.pcap", "caller"), ("eth0.pcap", "server")]


def test_a_folder_of_pod_folders_is_its_pods(tmp_path):
    root = tmp_path / "capture"
    _pod(root, "reviews-v1-7d9", "reviews-v1-7d9-lo.pcap", "reviews-v1-7d9-eth0.pcap")
    _pod(root, "ratings-v1-5f8", "ratings-v1-5f8-lo.pcap")
    got = pod_inputs([str(root)])
    assert [(a.pod, a.iface) for a in got.files] == [("ratings-v1-5f8", "lo"), ("reviews-v1-7d9", "eth0"),
                                                      ("reviews-v1-7d9", "lo")]
    assert got.skipped == ()
    # A folder with a file of its own is one pod: its subfolders are said, not read.
    (root / "notes.txt").write_text("x\n")
    got = pod_inputs([str(root)])
    assert [a.pod for a in got.files] == ["capture"] and len(got.skipped) == 2


def test_an_empty_pod_directory_beside_others_is_a_problem_and_alone_one_line(tmp_path):
    caller = _pod(tmp_path, "caller", "lo.pcap")
    (tmp_path / "server").mkdir()
    os.mkfifo(tmp_path / "server" / "pipe")
    got = pod_inputs([str(caller), str(tmp_path / "server")])
    assert [a.pod for a in got.files] == ["caller"]
    assert [p.where for p in got.skipped] == [str(tmp_path / "server" / "pipe"), str(tmp_path / "server")]
    assert "no file in it (it holds 1 entries, none a regular file)" in got.skipped[1].what
    with pytest.raises(InputError, match="no file in it"):
        pod_inputs([str(tmp_path / "server")])
