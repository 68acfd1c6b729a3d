"""The manifest-driven local deployment: ``podium deploy local --overlay dev``.

A kustomize overlay is rendered (:mod:`.render`) and read as Kubernetes would read it
(:mod:`.manifest`: workloads, pods, containers, their env with every ``valueFrom``/``envFrom``
resolved, probes, volumes, Services); what a cluster would provide and a laptop has not is
stood in for by real local parts, each substitution explicit (:mod:`.standins`: the Kafka
broker and its credentials for Strimzi's, operator Secrets generated, the KServe-V2 server for
Triton); the deployment is checked before anything starts (:mod:`.checks`: every env var is
read by some config, transactional ids fence); then every container of a Podium image runs
as a local process with exactly its rendered command, args and env, and its probes must pass
on their rendered ports (:mod:`.local`); a session through the orchestrator must
produce a learner version that the V2 server serves (:mod:`.cycle`). docs/operations.md.
"""
