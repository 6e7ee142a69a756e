"""The pod Kubernetes runs for the lighthouse's Deployment, and the name its Service gives it.

Rules, from kubernetes/kubernetes at v1.32 (the kubectl installed here):

- admission (pkg/apis/apps/validation/validation.go ``ValidateDeploymentSpec``): a selector that
  is not empty and matches the template's labels ("`selector` does not match template `labels`"),
  replicas of 0 or more, no ``rollingUpdate`` under ``strategy: Recreate``; the template's
  restartPolicy ``Always`` (``ValidatePodTemplateSpecForReplicaSet``); container port names IANA
  service names, at most 15 characters with a letter (pkg/apis/core/validation ``validateContainerPorts``,
  apimachinery ``IsValidPortName``); a Service's ports in 1..65535, named (a DNS-1123 label) when
  there are several, a named targetPort an IANA service name (``ValidateService``);
- pods: the Deployment controller makes a ReplicaSet ``<deployment>-<pod-template-hash>``
  (pkg/controller/deployment/sync.go), whose pods are ``<replicaset>-<5 characters>``
  (apiserver's ``names.SimpleNameGenerator``); their host name is the pod's name;
- the Service: ``<service>.<namespace>.svc.cluster.local`` answers with the Service's cluster IP,
  which kube-proxy forwards to the ready pods its selector matches. The cluster IP is not simulated:
  here the name resolves to the lighthouse pod's own address (what kube-proxy's forwarding ends at).
  A selector that matches no pod of the Deployment is an error here (the Service would have no
  endpoints, and every connection to it would be refused);
- ``$(POD_IP)`` (``fieldRef: status.podIP``) is known once the pod has its address:
  :func:`started` resolves the container then, as the kubelet does when it starts it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from collections.abc import Mapping, Sequence
from typing import Any

from k8s.sim_cluster import SimPod, SimulationError, expand, pod_fields, resolve_env

IANA_SVC_NAME = re.compile(r"[a-z0-9]([a-z0-9-]*[a-z0-9])?")
DNS1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")


def _port_name_ok(name: str) -> bool:
    return len(name) <= 15 and bool(IANA_SVC_NAME.fullmatch(name)) and "--" not in name and re.search("[a-z]", name)


def admit(deployment: Mapping[str, Any], service: Mapping[str, Any]) -> None:
    """Raise :class:`SimulationError` where the API server would refuse either object."""
    if (deployment.get("apiVersion"), deployment.get("kind")) != ("apps/v1", "Deployment"):
        raise SimulationError(f"not an apps/v1 Deployment: {deployment.get('apiVersion')} {deployment.get('kind')}")
    spec = deployment["spec"]
    selector = spec.get("selector", {}).get("matchLabels") or {}
    template = spec["template"]
    labels = template.get("metadata", {}).get("labels", {})
    if not selector:
        raise SimulationError("spec.selector: Required value")
    if any(labels.get(k) != v for k, v in selector.items()):
        raise SimulationError(
            "spec.template.metadata.labels: Invalid value: `selector` does not match template `labels`"
        )
    if spec.get("replicas", 1) < 0:
        raise SimulationError("spec.replicas: must be greater than or equal to 0")
    strategy = spec.get("strategy", {})
    if strategy.get("type") == "Recreate" and "rollingUpdate" in strategy:
        raise SimulationError("spec.strategy.rollingUpdate: may not be specified when strategy `type` is 'Recreate'")
    if template["spec"].get("restartPolicy", "Always") != "Always":
        raise SimulationError("spec.template.spec.restartPolicy: Unsupported value: supported values: Always")
    for container in template["spec"]["containers"]:
        names = [p["name"] for p in container.get("ports", []) if "name" in p]
        if len(set(names)) != len(names) or not all(_port_name_ok(n) for n in names):
            raise SimulationError(f"container {container['name']}: port names {names} are not unique IANA names")
    if (service.get("apiVersion"), service.get("kind")) != ("v1", "Service"):
        raise SimulationError("not a v1 Service")
    ports = service["spec"].get("ports", [])
    if not ports:
        raise SimulationError("spec.ports: Required value")
    for port in ports:
        if not 0 < port["port"] < 65536:
            raise SimulationError(f"spec.ports.port: {port['port']} is not in 1..65535")
        if len(ports) > 1 and not DNS1123_LABEL.fullmatch(port.get("name", "")):
            raise SimulationError("spec.ports.name: Required value when there are several ports")
        target = port.get("targetPort", port["port"])
        if isinstance(target, str) and not _port_name_ok(target):
            raise SimulationError(f"spec.ports.targetPort: {target!r} is not an IANA service name")
    chosen = service["spec"].get("selector", {})
    if not chosen or any(labels.get(k) != v for k, v in chosen.items()):
        raise SimulationError(f"Service {service['metadata']['name']}: its selector matches no pod of the Deployment")


def simulate(deployment: Mapping[str, Any], service: Mapping[str, Any]) -> SimPod:
    """The Deployment's one pod, resolvable by the Service's name (its command still holds ``$(POD_IP)``)."""
    admit(deployment, service)
    if deployment["spec"].get("replicas", 1) != 1:
        raise SimulationError("the lighthouse's Deployment must run exactly one pod")
    meta = deployment["metadata"]
    namespace = meta.get("namespace", "default")
    template = deployment["spec"]["template"]
    digest = hashlib.sha256(repr(template).encode()).hexdigest()
    name = f"{meta['name']}-{digest[:10]}-{digest[10:15]}"[:63]
    (container,) = template["spec"]["containers"]
    return SimPod(
        name=name,
        namespace=namespace,
        role="lighthouse",
        index=0,
        hostname=name,
        subdomain=None,
        services=[service["metadata"]["name"]],
        env={},
        command=list(container["command"]),
        args=list(container.get("args", [])),
        restart_policy="Always",
        termination_grace_s=template["spec"].get("terminationGracePeriodSeconds"),
        container=dict(container),
        labels=dict(template["metadata"]["labels"]),
    )


def started(pod: SimPod, pod_ip: str, secrets: Mapping[str, Mapping[str, str]] | None = None) -> SimPod:
    """``pod`` as the kubelet starts its container once the pod has address ``pod_ip``."""
    fields = {**pod_fields(pod.name, pod.namespace, pod.labels, pod.annotations), "status.podIP": pod_ip}
    env = resolve_env(pod.container.get("env", []), pod_fields=fields, secrets=secrets or {})
    command = [expand(word, env) for word in pod.container["command"]]
    args = [expand(word, env) for word in pod.container.get("args", [])]
    return dataclasses.replace(pod, env=env, command=command, args=args)


def split(objects: Sequence[Mapping[str, Any]]) -> tuple[dict, dict, dict]:
    """The Deployment, the Service and the job (a PyTorchJob or a TrainJob) of a rendered fault-tolerant job."""
    deployment, service, job = (dict(obj) for obj in objects)
    if (deployment["kind"], service["kind"]) != ("Deployment", "Service"):
        raise SimulationError(f"not a lighthouse beside a job: {[obj['kind'] for obj in objects]}")
    return deployment, service, job
