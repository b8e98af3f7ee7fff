"""The live capture of a pod, from the script its debug container runs to the events the pipeline reads.

pod_script (tcpdump, and tshark with --dissect pod, in the pod) -> pump (the exec stream's bytes) -> dissect (one
tshark here for every stream) or pod_fields (the pod's tshark lines) -> PacketEvents; sidecar_link (Envoy admin,
the followed log) and kernel (the pod's counters) beside it; run (LiveRun) drives one pod's capture.
"""
