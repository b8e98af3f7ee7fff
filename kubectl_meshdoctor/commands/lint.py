"""`kubectl meshdoctor lint`: the static rules (lint/) over the pods' specs, as a report."""

from __future__ import annotations

import sys

from kubernetes.client import ApiClient

from kubectl_meshdoctor.commands.console import error
from kubectl_meshdoctor.core.pipeline import PipelineStats
from kubectl_meshdoctor.core.report_model import LintSource, Report
from kubectl_meshdoctor.kube.client import KubeError, KubeOptions, api_call, connect
from kubectl_meshdoctor.kube.manifests import pods_of_file
from kubectl_meshdoctor.kube.target import Target, resolve_pods
from kubectl_meshdoctor.lint import lint_pods
from kubectl_meshdoctor.frontends.report import rendered_for


def _lint_file(args) -> int:
    try:
        pods = pods_of_file(args.filename)
    except ValueError as e:
        return error(str(e))
    names = [f"{(p.get('metadata') or {}).get('namespace', 'default')}/{(p.get('metadata') or {}).get('name', '?')}"
             for p in pods]
    findings = []
    for name, pod in zip(names, pods):
        try:
            findings += lint_pods([pod])
        except (TypeError, AttributeError, ValueError, KeyError) as e:  # a shape kube/manifests.py lets through
            where = "stdin" if args.filename == "-" else args.filename
            return error(f"{where}: pod {name} is not a Pod the API server would accept ({type(e).__name__}: {e})")
    report = Report(LintSource(tuple(names)), PipelineStats(), findings)
    sys.stdout.write(rendered_for(args.output, report, sys.stdout))
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
    report = Report(LintSource(tuple(names)), PipelineStats(), findings)
    sys.stdout.write(rendered_for(args.output, report, sys.stdout))
    return report.exit_code()
