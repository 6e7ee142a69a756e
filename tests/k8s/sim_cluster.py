"""What Kubernetes itself does to a pod the operators create: DNS, environment, command expansion.

The operator simulations (:mod:`k8s.sim_pytorchjob`, :mod:`k8s.sim_trainjob`, :mod:`k8s.sim_mpijob`)
decide each pod's name, host name, Services and container; this module applies the rules of the
cluster around them, as their sources and Kubernetes' documentation state them:

- DNS (kubernetes.io/docs/concepts/services-networking/dns-pod-service/, cluster domain
  ``cluster.local``): a headless Service ``S`` resolves as ``S.<ns>.svc.cluster.local`` to the pods
  it selects; a pod with ``hostname`` H and ``subdomain`` D (a headless Service of that name)
  resolves as ``H.D.<ns>.svc.cluster.local``. Each pod's resolv.conf searches
  ``<ns>.svc.cluster.local svc.cluster.local cluster.local`` plus its ``dnsConfig.searches``, so a
  shorter name resolves when it plus one search domain is a record (:func:`resolvable_names`).
  The kubelet writes the pod's own names into its /etc/hosts.
- Environment (kubelet, pkg/kubelet/kubelet_pods.go ``makeEnvironmentVariables``): variables in
  order, a later one of the same name winning; ``value`` expands ``$(NAME)`` of those before it;
  ``valueFrom`` reads a secret key or a field of the pod (a missing secret keeps the container from
  starting: :class:`SimulationError`).
- Command (kubernetes third_party/forked/golang/expansion): ``$(NAME)`` in ``command`` and ``args``
  expands to the variable's value, ``$$`` to ``$``, an unknown ``$(NAME)`` stays as written.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

CLUSTER_DOMAIN = "cluster.local"


class SimulationError(Exception):
    """The cluster would refuse the object, or the pod could not start (the message says which rule)."""


@dataclass
class SimPod:
    """One pod as the operator and the kubelet would create and start it."""

    name: str
    namespace: str
    role: str
    """Replica type or role: master, worker, node, launcher."""
    index: int
    hostname: str
    """What ``hostname`` prints in the pod (``spec.hostname``, else the pod's name)."""
    subdomain: str | None
    services: list[str]
    """Names of the headless Services that select this pod."""
    env: dict[str, str]
    """The main container's environment, resolved as the kubelet resolves it (in order)."""
    command: list[str]
    args: list[str]
    restart_policy: str
    termination_grace_s: int | None
    container: dict[str, Any]
    """The main container as created (operator's additions included)."""
    volumes: list[dict[str, Any]] = field(default_factory=list)
    init_containers: list[dict[str, Any]] = field(default_factory=list)
    dns_searches: list[str] = field(default_factory=list)
    """Extra resolv.conf search domains (``spec.dnsConfig.searches``)."""
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    files: dict[str, str] = field(default_factory=dict)
    """Files the operator provides in the pod (ConfigMap and Secret volumes), by their in-pod path."""

    @property
    def argv(self) -> list[str]:
        """What the container runs: command then args (the image's entry point is not simulated)."""
        return [*self.command, *self.args]

    @property
    def fqdn(self) -> str:
        """The pod's own fully qualified name (kubelet's /etc/hosts line)."""
        if self.subdomain:
            return f"{self.hostname}.{self.subdomain}.{self.namespace}.svc.{CLUSTER_DOMAIN}"
        return self.hostname

    @property
    def records(self) -> list[str]:
        """The DNS records (FQDNs) that resolve to this pod's IP."""
        names = [f"{s}.{self.namespace}.svc.{CLUSTER_DOMAIN}" for s in self.services]
        if self.subdomain:
            names.insert(0, self.fqdn)
        return names

    @property
    def search(self) -> list[str]:
        ns = self.namespace
        return [f"{ns}.svc.{CLUSTER_DOMAIN}", f"svc.{CLUSTER_DOMAIN}", CLUSTER_DOMAIN, *self.dns_searches]

    def mounts(self) -> dict[str, dict[str, Any]]:
        """Mount path -> the volume mounted there, for the main container."""
        volumes = {v["name"]: v for v in self.volumes}
        return {m["mountPath"]: volumes[m["name"]] for m in self.container.get("volumeMounts", [])}


def resolvable_names(pods: Sequence[SimPod], viewer: SimPod) -> dict[str, str]:
    """Every name ``viewer`` can resolve to a pod of ``pods`` -> that pod's name.

    A record R is reachable as R itself and as any P such that ``P + "." + d == R`` for a search
    domain d of the viewer; the viewer's own host name comes from its /etc/hosts.
    """
    names: dict[str, str] = {}
    for pod in pods:
        for record in pod.records:
            names.setdefault(record, pod.name)
            for domain in viewer.search:
                if record.endswith("." + domain):
                    names.setdefault(record[: -len(domain) - 1], pod.name)
    names.setdefault(viewer.hostname, viewer.name)
    names.setdefault(viewer.fqdn, viewer.name)
    return names


_VAR = re.compile(r"\$(\$|\(([A-Za-z_][A-Za-z0-9_.-]*)\))")


def expand(text: str, env: Mapping[str, str]) -> str:
    """Kubernetes' ``$(NAME)`` expansion (``$$`` escapes a ``$``; unknown names stay as written)."""

    def replace(match: re.Match) -> str:
        if match.group(1) == "$":
            return "$"
        name = match.group(2)
        return env[name] if name in env else match.group(0)

    return _VAR.sub(replace, text)


def resolve_env(
    entries: Sequence[Mapping[str, Any]],
    *,
    pod_fields: Mapping[str, str],
    secrets: Mapping[str, Mapping[str, str]],
) -> dict[str, str]:
    """A container's ``env`` list as the process sees it."""
    env: dict[str, str] = {}
    for entry in entries:
        name = entry["name"]
        if "valueFrom" in entry:
            source = entry["valueFrom"]
            if "secretKeyRef" in source:
                ref = source["secretKeyRef"]
                secret = secrets.get(ref["name"])
                if secret is None or ref["key"] not in secret:
                    if ref.get("optional"):
                        continue
                    raise SimulationError(
                        f"CreateContainerConfigError: secret {ref['name']!r} key {ref['key']!r} not found (env {name})"
                    )
                env[name] = secret[ref["key"]]
            elif "fieldRef" in source:
                path = source["fieldRef"]["fieldPath"]
                if path not in pod_fields:
                    raise SimulationError(f"env {name}: field {path} is not simulated")
                env[name] = pod_fields[path]
            else:
                raise SimulationError(f"env {name}: {sorted(source)} is not simulated")
        else:
            env.pop(name, None)  # a later definition wins, and takes the later position
            env[name] = expand(entry.get("value", ""), env)
    return env


def pod_fields(name: str, namespace: str, labels: Mapping[str, str], annotations: Mapping[str, str]) -> dict[str, str]:
    """The downward-API fields an env ``fieldRef`` may name."""
    fields = {"metadata.name": name, "metadata.namespace": namespace}
    fields.update({f"metadata.labels['{k}']": v for k, v in labels.items()})
    fields.update({f"metadata.annotations['{k}']": v for k, v in annotations.items()})
    return fields


def start_container(
    *,
    name: str,
    namespace: str,
    container: Mapping[str, Any],
    labels: Mapping[str, str],
    annotations: Mapping[str, str],
    secrets: Mapping[str, Mapping[str, str]],
) -> tuple[dict[str, str], list[str], list[str]]:
    """The environment, command and args of ``container`` once the kubelet has resolved them."""
    env = resolve_env(
        container.get("env", []), pod_fields=pod_fields(name, namespace, labels, annotations), secrets=secrets
    )
    command = [expand(word, env) for word in container.get("command", [])]
    args = [expand(word, env) for word in container.get("args", [])]
    if not command:
        raise SimulationError(f"pod {name}: no command (the image's entry point is not simulated)")
    return env, command, args


def start_pod(
    pod: Mapping[str, Any],
    *,
    role: str,
    index: int,
    services: list[str],
    secrets: Mapping[str, Mapping[str, str]],
    restart_policy: str | None = None,
    main: str | None = None,
) -> SimPod:
    """The pod the kubelet starts from ``pod``, the Pod object an operator creates (``metadata``:
    name, namespace, labels, annotations; ``spec``: containers, hostname, subdomain, init containers,
    ``dnsConfig``), its main container the one named ``main`` (default the first).

    ``services``: the headless Services that select it; ``restart_policy``: the replica's, which the
    operator acts on (default the pod's own ``restartPolicy``).
    """
    metadata, pod_spec = pod["metadata"], pod["spec"]
    name, namespace = metadata["name"], metadata["namespace"]
    labels, annotations = dict(metadata.get("labels", {})), dict(metadata.get("annotations", {}))
    container = next(c for c in pod_spec["containers"] if main is None or c["name"] == main)
    env, command, args = start_container(
        name=name, namespace=namespace, container=container, labels=labels, annotations=annotations, secrets=secrets
    )
    return SimPod(
        name=name,
        namespace=namespace,
        role=role,
        index=index,
        hostname=pod_spec.get("hostname") or name,
        subdomain=pod_spec.get("subdomain"),
        services=services,
        env=env,
        command=command,
        args=args,
        restart_policy=restart_policy or pod_spec["restartPolicy"],
        termination_grace_s=pod_spec.get("terminationGracePeriodSeconds"),
        container=dict(container),
        volumes=list(pod_spec.get("volumes", [])),
        init_containers=list(pod_spec.get("initContainers", [])),
        dns_searches=list(pod_spec.get("dnsConfig", {}).get("searches", [])),
        labels=labels,
        annotations=annotations,
    )


DNS1035 = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")


def is_dns1035_label(name: str) -> bool:
    """apimachinery's IsDNS1035Label: lowercase alphanumerics and '-', starting with a letter, <= 63."""
    return len(name) <= 63 and DNS1035.fullmatch(name) is not None
