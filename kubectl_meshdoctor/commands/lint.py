"""`kubectl meshdoctor lint`: the static rules (lint/) over the pods' specs, as a report."""

from __future__ import annotations

import sys
from pathlib import Path

import yaml
from kubernetes.client import ApiClient

from kubectl_meshdoctor.commands.console import error
from kubectl_meshdoctor.core.pipeline import PipelineStats
from kubectl_meshdoctor.kube.client import KubeError, KubeOptions, api_call, connect
from kubectl_meshdoctor.kube.target import Target, resolve_pods
from kubectl_meshdoctor.lint import lint_pods
from kubectl_meshdoctor.sinks.report import RENDERERS, Report


def pods_of_file(path: str) -> list[dict]:
    """The Pods in a YAML or JSON file (``-``: stdin): one or more documents, each a Pod or a List of them (as
    ``kubectl get pods -o yaml`` writes). Raises ValueError naming the file for anything else."""
    where = "stdin" if path == "-" else path
    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text()
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"cannot read {where}: {getattr(e, 'strerror', None) or e}") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark is not None else ""
        raise ValueError(f"{where} is not YAML or JSON{at}") from None
    pods = []
    for doc in docs:
        items = doc.get("items") if isinstance(doc, dict) and str(doc.get("kind", "")).endswith("List") else [doc]
        for item in items or ():
            kind = item.get("kind") if isinstance(item, dict) else type(item).__name__
            if kind != "Pod":
                raise ValueError(f"{where}: lint reads Pods, not {kind or 'an object without a kind'} (a "
                                 f"Deployment's template is not injected yet: lint its pods)")
            pods.append(item)
    if not pods:
        raise ValueError(f"{where} holds no Pod")
    return pods


def _lint_file(args) -> int:
    try:
        pods = pods_of_file(args.filename)
    except ValueError as e:
        return error(str(e))
    names = [f"{(p.get('metadata') or {}).get('namespace', 'default')}/{(p.get('metadata') or {}).get('name', '?')}"
             for p in pods]
    report = Report({"kind": "lint", "pods": names}, PipelineStats(), lint_pods(pods))
    sys.stdout.write(RENDERERS[args.output](report))
    return report.exit_code()


def run(args) -> int:
    """`kubectl meshdoctor lint`: the static rules over the pods' specs (from the cluster, or a file)."""
    if sum(map(bool, (args.target, args.selector, args.all_namespaces, args.filename))) != 1:
        return error("name one target: pod/NAME, deploy/NAME, -l SELECTOR, -A, or -f FILE")
    if args.filename:
        return _lint_file(args)
    try:
        kube = connect(KubeOptions(args.kubeconfig, args.context, args.namespace, args.request_timeout))
        ns = args.namespace or kube.namespace
        if args.all_namespaces:
            pods = api_call(kube, "listing pods", kube.core.list_pod_for_all_namespaces).items
        elif args.selector:
            pods = api_call(kube, f"listing pods with -l {args.selector}", kube.core.list_namespaced_pod, ns,
                            label_selector=args.selector).items
        else:
            pods = resolve_pods(kube, Target.parse(args.target), ns)
    except (ValueError, KubeError) as e:
        return error(str(e))
    if not pods:
        return error("no pod matches")
    serialize = ApiClient().sanitize_for_serialization
    findings = lint_pods([serialize(p) for p in pods])
    names = [f"{p.metadata.namespace}/{p.metadata.name}" for p in pods]
    report = Report({"kind": "lint", "pods": names}, PipelineStats(), findings)
    sys.stdout.write(RENDERERS[args.output](report))
    return report.exit_code()
