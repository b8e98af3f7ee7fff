"""`kubectl meshdoctor lint`: the static rules (lint/) over the pods' specs, as a report."""

from __future__ import annotations

import sys

from kubernetes.client import ApiClient

from kubectl_meshdoctor.commands.console import error
from kubectl_meshdoctor.core.pipeline import PipelineStats
from kubectl_meshdoctor.kube.client import KubeError, KubeOptions, api_call, connect
from kubectl_meshdoctor.kube.target import Target, resolve_pods
from kubectl_meshdoctor.lint import lint_pods
from kubectl_meshdoctor.sinks.report import RENDERERS, Report


def run(args) -> int:
    """`kubectl meshdoctor lint`: the static rules over the pods' specs."""
    if sum(map(bool, (args.target, args.selector, args.all_namespaces))) != 1:
        return error("name one target: pod/NAME, deploy/NAME, -l SELECTOR, or -A")
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
