"""The krew manifest and the archive scripts/build-krew makes for it.

`krew_problems` holds a manifest to the rules krew applies (kubernetes-sigs/krew: internal/index/validation/
validate.go for every manifest `krew install` reads, cmd/validate-krew-manifest for the platforms, and
internal/installation for how `files` and `bin` are installed). The build tests run the real script, which
downloads from the package index (about a minute), with HOME and TMPDIR in tmp so nothing is left behind.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import posixpath
import re
import shutil
import subprocess
import tarfile
import tomllib
from importlib.machinery import SourceFileLoader
from importlib.util import module_from_spec, spec_from_loader
from pathlib import Path

import pytest
import yaml

from .conftest import KREW_BUILD, start_build

REPO = Path(__file__).resolve().parent.parent.parent
MANIFEST = REPO / "krew-manifest.yaml"
BUILD = REPO / "scripts" / "build-krew"
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
VERSION = PYPROJECT["project"]["version"]

KREW_API_VERSION = "krew.googlecontainertools.github.com/v1alpha2"
SAFE_NAME = re.compile(r"^[\w-]+$")
WINDOWS_FORBIDDEN = {"CON", "PRN", "AUX", "NUL", *(f"COM{i}" for i in range(1, 10)), *(f"LPT{i}" for i in range(1, 10))}
SHA256 = re.compile(r"^[a-f0-9]{64}$")
# k8s.io/apimachinery's ParseSemantic, with the "v" krew's semver.Parse insists on.
SEMVER = re.compile(r"^v(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(-[0-9A-Za-z.-]+)?(\+[0-9A-Za-z.-]+)?$")
# validate-krew-manifest's allPlatforms: a selector must match one of them, and no two platforms the same one.
KREW_PLATFORMS = [("windows", "386"), ("windows", "amd64"), ("windows", "arm64"), ("linux", "386"),
                  ("linux", "amd64"), ("linux", "arm"), ("linux", "arm64"), ("linux", "ppc64le"),
                  ("darwin", "386"), ("darwin", "amd64"), ("darwin", "arm64")]


def selector_matches(selector: dict, os_name: str, arch: str) -> bool:
    labels = {"os": os_name, "arch": arch}
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for expr in selector.get("matchExpressions") or []:
        value, op, values = labels.get(expr["key"]), expr["operator"], expr.get("values") or []
        if (op == "In" and value not in values) or (op == "NotIn" and value in values):
            return False
    return True


def installed_files(files: list[dict] | None, archive: set[str]) -> set[str]:
    """The paths krew installs from an archive holding ``archive`` (installation/move.go); files that match
    nothing are an error there, a ValueError here."""
    result = set()
    for op in files if files is not None else [{"from": "*", "to": "."}]:
        src, dest = op["from"], op["to"]
        if src in archive:  # a direct move; "." keeps the name
            result.add(posixpath.basename(src) if dest == "." else dest)
            continue
        matched = [n for n in archive if fnmatch.fnmatch(n, src)]
        if not matched:
            raise ValueError(f"no files in the archive match {src!r}")
        result.update(posixpath.normpath(posixpath.join(dest, posixpath.basename(n))) for n in matched)
    return result


def krew_problems(m: dict, name: str = "meshdoctor") -> list[str]:
    """Why krew would refuse manifest ``m`` for plugin ``name``; [] when it would take it."""
    problems = []
    spec = m.get("spec") or {}
    if m.get("apiVersion") != KREW_API_VERSION:
        problems.append(f"apiVersion {m.get('apiVersion')!r}")
    if m.get("kind") != "Plugin":
        problems.append(f"kind {m.get('kind')!r}")
    meta_name = (m.get("metadata") or {}).get("name", "")
    if not SAFE_NAME.match(name) or name.upper() in WINDOWS_FORBIDDEN or meta_name != name:
        problems.append(f"name {meta_name!r}")
    short = spec.get("shortDescription") or ""
    if not short or "\n" in short or "\r" in short:
        problems.append("shortDescription empty or not one line")
    if not SEMVER.match(str(spec.get("version", ""))):
        problems.append(f"version {spec.get('version')!r} is not semver with a v")
    platforms = spec.get("platforms") or []
    if not platforms:
        problems.append("no platforms")
    for i, p in enumerate(platforms):
        if not p.get("uri"):
            problems.append(f"platform {i}: no uri")
        if not SHA256.match(str(p.get("sha256", ""))):
            problems.append(f"platform {i}: sha256 {p.get('sha256')!r}")
        files = p.get("files")
        if files is not None and (not files or any(not f.get("from") or not f.get("to") for f in files)):
            problems.append(f"platform {i}: files need from and to")
        elif files and any(posixpath.normpath(f["to"]) != f["to"] for f in files):
            problems.append(f"platform {i}: a files[].to is not a clean path")
        sel = p.get("selector")
        if not sel or (not sel.get("matchLabels") and not sel.get("matchExpressions")):
            problems.append(f"platform {i}: empty selector")
        else:
            keys = [*(sel.get("matchLabels") or {}), *(e.get("key") for e in sel.get("matchExpressions") or [])]
            if any(k not in ("os", "arch") for k in keys):
                problems.append(f"platform {i}: selector keys {keys}")
            if not any(selector_matches(sel, o, a) for o, a in KREW_PLATFORMS):
                problems.append(f"platform {i}: selector matches no platform krew supports")
        bin_ = p.get("bin")
        if not bin_:
            problems.append(f"platform {i}: no bin")
        elif files and posixpath.normpath(bin_) not in {posixpath.basename(f["from"]) if f["to"] == "." else f["to"]
                                                         for f in files if f.get("from") and f.get("to")}:
            problems.append(f"platform {i}: bin {bin_!r} is none of the files' to")
    for o, a in KREW_PLATFORMS:
        if sum(selector_matches(p.get("selector") or {}, o, a) for p in platforms if p.get("selector")) > 1:
            problems.append(f"two platforms select {o}/{a}")
    return problems


def load_manifest(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


def build_script():
    """scripts/build-krew as a module (it has no .py suffix), to read its constants."""
    loader = SourceFileLoader("build_krew", str(BUILD))
    module = module_from_spec(spec_from_loader("build_krew", loader))
    loader.exec_module(module)
    return module


# ------------------------------------------------------------------------------------------- the manifest


def test_manifest_is_what_krew_accepts():
    m = load_manifest(MANIFEST)
    assert krew_problems(m) == []
    assert m["spec"]["version"] == f"v{VERSION}"  # pyproject.toml's, with krew's v
    assert m["spec"]["homepage"] and m["spec"]["description"].strip()


@pytest.mark.parametrize("breakage, problem", [
    (lambda m: m["metadata"].update(name="mesh doctor"), "name"),
    (lambda m: m.update(apiVersion="krew.googlecontainertools.github.com/v1alpha1"), "apiVersion"),
    (lambda m: m["spec"].update(version="0.1.0"), "version"),
    (lambda m: m["spec"].update(version="v0.1"), "version"),
    (lambda m: m["spec"].update(shortDescription="two\nlines"), "shortDescription"),
    (lambda m: m["spec"]["platforms"][0].update(sha256="A" * 64), "sha256"),
    (lambda m: m["spec"]["platforms"][0].update(sha256="0" * 63), "sha256"),
    (lambda m: m["spec"]["platforms"][0].update(bin="kubectl-doctor"), "bin"),
    (lambda m: m["spec"]["platforms"][0].update(files=[]), "files"),
    (lambda m: m["spec"]["platforms"][0]["files"][0].update(to="./kubectl-meshdoctor"), "clean path"),
    (lambda m: m["spec"]["platforms"][0]["selector"]["matchLabels"].update(distro="debian"), "selector keys"),
    (lambda m: m["spec"]["platforms"][0]["selector"]["matchLabels"].update(os="plan9"), "no platform"),
    (lambda m: m["spec"]["platforms"][0].update(selector={"matchLabels": {}}), "empty selector"),
    (lambda m: m["spec"]["platforms"].append(m["spec"]["platforms"][0]), "two platforms"),
    (lambda m: m["spec"].update(platforms=[]), "no platforms"),
])
def test_the_check_refuses_what_krew_refuses(breakage, problem):
    m = load_manifest(MANIFEST)
    breakage(m)
    assert any(problem in p for p in krew_problems(m)), krew_problems(m)


def test_caveats_say_what_the_users_machine_needs():
    caveats = load_manifest(MANIFEST)["spec"]["caveats"]
    for python in build_script().PYTHONS:  # the CPythons the archive carries wheels for
        assert python in caveats
    for need in ("tshark", "pods/ephemeralcontainers", "pods/exec", "pods/portforward", "pods/log", "--dry-run",
                 "~/.cache/pex", f"store/meshdoctor/v{VERSION}/kubectl_complete-meshdoctor"):
        assert need in caveats, need


def test_rendering_fills_in_the_archive_and_keeps_the_rest():
    script = build_script()
    text = script.render_manifest(MANIFEST.read_text(), "ab" * 32, "linux", "arm64",
                                  "https://example.invalid/r/x.tar.gz", "x.tar.gz")
    m = yaml.safe_load(text)
    assert krew_problems(m) == []
    (platform,) = m["spec"]["platforms"]
    assert (platform["sha256"], platform["uri"]) == ("ab" * 32, "https://example.invalid/r/x.tar.gz")
    assert platform["selector"]["matchLabels"] == {"os": "linux", "arch": "arm64"}
    assert "placeholder" not in text  # the template's note on its placeholders stays behind
    assert m["spec"]["caveats"] == load_manifest(MANIFEST)["spec"]["caveats"]


def test_build_refuses_a_manifest_that_does_not_describe_the_archive():
    script = build_script()
    template = MANIFEST.read_text()
    shipped = {"kubectl-meshdoctor", "kubectl_complete-meshdoctor", "LICENSE"}
    script.check_manifest(template, VERSION, shipped)
    with pytest.raises(script.BuildError, match="LICENSE"):
        script.check_manifest(template, VERSION, shipped - {"LICENSE"})
    with pytest.raises(script.BuildError, match="pyproject.toml says 9.9.9"):
        script.check_manifest(template, "9.9.9", shipped)


def test_dist_is_ignored_by_git():
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("not a git checkout")
    proc = subprocess.run(["git", "-C", str(REPO), "check-ignore", "-q", "dist/x.tar.gz"], timeout=60)
    assert proc.returncode == 0


# ------------------------------------------------------------------------------------------- the archive


class Built:
    def __init__(self, root: Path, proc: subprocess.CompletedProcess, seconds: float) -> None:
        self.root, self.proc, self.seconds = root, proc, seconds
        self.out = root / "out"
        fields = dict(line.split(":", 1) for line in proc.stdout.splitlines() if ":" in line)
        self.archive = root / fields["archive"].strip()
        self.sha256 = fields["sha256"].strip()
        self.manifest = root / fields["manifest"].strip()


@pytest.fixture(scope="module")
def built(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Built:
    """The build conftest.py started as collection ended (or one started now)."""
    build = request.config.stash.get(KREW_BUILD, None) or start_build(tmp_path_factory.mktemp("krew"))
    proc, seconds = build.wait(timeout=1200)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return Built(build.root, proc, seconds)


def test_build_prints_the_archive_and_its_sha256_and_leaves_nothing_else(built):
    print(f"scripts/build-krew took {built.seconds:.0f} s")
    assert built.archive.name == f"kubectl-meshdoctor-v{VERSION}-linux-amd64.tar.gz"
    assert hashlib.sha256(built.archive.read_bytes()).hexdigest() == built.sha256
    assert sorted(p.name for p in built.out.iterdir()) == sorted([built.archive.name, "krew-manifest.yaml"])
    assert list((built.root / "tmp").iterdir()) == []  # its temporary directory is gone
    home = built.root / "home"
    # No cache of pip's, pex's or shiv's in HOME. (pip asks `rustc --version` for its user agent, and rustup's
    # proxy, where there is one, writes ~/.rustup/settings.toml: not ours, and a real HOME has it already.)
    assert {p.name for p in home.iterdir()} <= {".rustup"}
    assert "Traceback" not in built.proc.stderr


def test_rendered_manifest_describes_the_archive(built):
    m = load_manifest(built.manifest)
    assert krew_problems(m) == []
    (platform,) = m["spec"]["platforms"]
    assert platform["sha256"] == built.sha256
    assert platform["uri"].endswith("/" + built.archive.name)
    assert platform["selector"] == {"matchLabels": {"os": "linux", "arch": "amd64"}}  # this machine's
    template = load_manifest(MANIFEST)
    template["spec"]["platforms"][0].update(sha256=built.sha256, uri=platform["uri"])
    assert m == template  # nothing else differs from the repository's manifest

    assert built.archive.read_bytes()[:2] == b"\x1f\x8b"  # krew picks its extractor by sniffing: gzip
    with tarfile.open(built.archive) as tar:
        members = tar.getmembers()
    names = {t.name for t in members}
    # krew's tar extractor takes regular files and directories only and refuses .. and absolute names.
    assert all(t.isreg() and ".." not in t.name and not t.name.startswith("/") for t in members)
    licenses = {n for n in ("LICENSE", "LICENSE.txt", "LICENSE.md", "COPYING") if (REPO / n).is_file()}
    assert names == {"kubectl-meshdoctor", "kubectl_complete-meshdoctor", *licenses}
    # Every file is installed (none lies in the archive unlisted) and bin is one of them.
    assert installed_files(platform["files"], names) == names
    assert platform["bin"] in names
    assert all(t.mode & 0o111 for t in members if t.name.startswith("kubectl"))


@pytest.fixture(scope="module")
def installed(built, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    """The archive laid out as krew lays it out: files in a store directory, bin linked from a bin directory
    (and the completion hook too, as the caveats say); HOME in tmp, so the pex cache lands there."""
    root = tmp_path_factory.mktemp("krew-root")
    store, bindir, home = root / "store" / "meshdoctor" / f"v{VERSION}", root / "bin", root / "home"
    for d in (store, bindir, home):
        d.mkdir(parents=True)
    m = load_manifest(built.manifest)
    with tarfile.open(built.archive) as tar:
        for op in m["spec"]["platforms"][0]["files"]:
            member = tar.getmember(op["from"])
            dest = store / op["to"]
            dest.write_bytes(tar.extractfile(member).read())
            dest.chmod(member.mode)
    (bindir / "kubectl-meshdoctor").symlink_to(store / m["spec"]["platforms"][0]["bin"])
    (bindir / "kubectl_complete-meshdoctor").symlink_to(store / "kubectl_complete-meshdoctor")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PEX_", "SHIV_", "XDG_"))}
    env.update(HOME=str(home), PATH=f"{bindir}{os.pathsep}{env['PATH']}", KUBECONFIG=str(root / "no-kubeconfig"))
    return bindir, env


def test_installed_plugin_runs_and_caches_in_home(installed):
    bindir, env = installed
    proc = subprocess.run([str(bindir / "kubectl-meshdoctor"), "--version"], capture_output=True, text=True,
                          timeout=300, env=env)
    assert proc.returncode == 0 and proc.stdout.strip() == f"kubectl-meshdoctor {VERSION}", proc
    assert (Path(env["HOME"]) / ".cache" / "pex").is_dir()  # where the caveats say it goes


def test_completion_hook_of_the_archive(installed):
    bindir, env = installed
    proc = subprocess.run([str(bindir / "kubectl_complete-meshdoctor"), "watch", "--kubec"], capture_output=True,
                          text=True, timeout=300, env=env)
    assert proc.returncode == 0 and proc.stderr == "", proc
    assert [line.split("\t")[0] for line in proc.stdout.splitlines()] == ["--kubeconfig", ":4"]
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        return
    version = subprocess.run([kubectl, "version", "--client", "-o", "json"], capture_output=True, text=True,
                             timeout=60, env=env)
    minor = json.loads(version.stdout or "{}").get("clientVersion", {}).get("minor", "0")
    if int(re.sub(r"\D", "", minor) or 0) >= 26:  # kubectl runs the hook it finds beside the plugin on PATH
        proc = subprocess.run([kubectl, "__complete", "meshdoctor", "wa"], capture_output=True, text=True,
                              timeout=60, env=env)
        assert proc.stdout.splitlines()[0].split("\t")[0] == "watch", proc


def test_archive_carries_the_package_metadata(installed):
    """Entry points work inside the archive: every script and entry-point group pyproject.toml declares (the
    detectors' group too, once it is declared), and every top-level kubectl_meshdoctor* package imports."""
    bindir, env = installed
    declared = {"console_scripts": dict(PYPROJECT["project"].get("scripts", {}))}
    for group, entries in PYPROJECT["project"].get("entry-points", {}).items():
        declared.setdefault(group, {}).update(entries)
    packages = sorted(p.name for p in REPO.glob("kubectl_meshdoctor*") if (p / "__init__.py").is_file())
    probe = f"""
import importlib, importlib.metadata as md, json
dist = md.distribution("kubectl-meshdoctor")
found = {{g: {{e.name: e.value for e in md.entry_points(group=g)}} for g in {sorted(declared)!r}}}
for p in {packages!r}:
    importlib.import_module(p)
print(json.dumps({{"version": dist.version, "found": found}}))
"""
    proc = subprocess.run([str(bindir / "kubectl-meshdoctor"), "-c", probe], capture_output=True, text=True,
                          timeout=300, env={**env, "PEX_INTERPRETER": "1"})
    assert proc.returncode == 0, proc
    got = json.loads(proc.stdout)
    assert got["version"] == VERSION
    for group, entries in declared.items():
        for name, value in entries.items():
            assert got["found"][group].get(name) == value, (group, name)


@pytest.mark.skipif(shutil.which("tshark") is None, reason="analyze reads captures through tshark")
def test_the_archive_runs_its_detectors_on_a_capture(installed):
    """The built-in detectors are found through entry points inside the archive too, and find what they
    find in a checkout."""
    bindir, env = installed
    capture = REPO / "tests" / "data" / "lab-collision-eth0.pcap"
    proc = subprocess.run([str(bindir / "kubectl-meshdoctor"), "analyze", f"{capture}:eth0", "-o", "json"],
                          capture_output=True, text=True, timeout=300, env={**env, "PATH": os.environ["PATH"]})
    assert proc.returncode == 1, proc.stderr  # 1: an error finding
    assert [f["detector"] for f in json.loads(proc.stdout)["findings"]] == ["tuple-collision"]


def test_the_archive_carries_no_lab(installed):
    """The pod lab is a distribution of its own: the archive krew installs has none of it, so `lab` says where
    to get it, in one line."""
    bindir, env = installed
    probe = ("import importlib.util, importlib.metadata as md, json\n"
             "print(json.dumps({'module': importlib.util.find_spec('meshdoctor_lab') is not None,\n"
             "                  'commands': [e.name for e in md.entry_points(group='kubectl_meshdoctor.commands')]}))\n")
    proc = subprocess.run([str(bindir / "kubectl-meshdoctor"), "-c", probe], capture_output=True, text=True,
                          timeout=300, env={**env, "PEX_INTERPRETER": "1"})
    assert proc.returncode == 0, proc
    assert json.loads(proc.stdout) == {"module": False, "commands": []}
    proc = subprocess.run([str(bindir / "kubectl-meshdoctor"), "lab", "up"], capture_output=True, text=True,
                          timeout=300, env=env)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "pip install ./lab" in proc.stderr, proc
