"""Validate Kubernetes objects against the operators' CRD schemas, offline, as the API server would.

The CRDs in ``../shared/data/k8s-crds`` carry OpenAPI v3 *structural* schemas
(``spec.versions[].schema.openAPIV3Schema``). The API server checks a custom resource against that
schema with a few Kubernetes rules on top; :func:`validate` applies the same with ``jsonschema``
(Draft 4, the dialect OpenAPI v3.0 schemas follow):

- unknown fields: the server prunes any field its structural schema does not declare, and ``kubectl
  apply`` (server-side field validation, ``--validate=strict``, the default since kubectl 1.27)
  rejects it; here every object without ``x-kubernetes-preserve-unknown-fields`` gets
  ``additionalProperties: false``, so an unknown or misspelled field is an error;
- ``x-kubernetes-int-or-string``: an integer or a string (resource quantities, ports);
- ``x-kubernetes-list-type: map`` (with ``x-kubernetes-list-map-keys``, a missing key taking its
  schema default, e.g. a port's protocol ``TCP``) and ``set``: no two items with the same key(s);
  ``atomic`` constrains nothing;
- ``x-kubernetes-validations`` (CEL): each rule in these CRDs is translated in :data:`CEL_RULES`;
  transition rules (those naming ``oldSelf``) only apply to updates and are skipped for a create;
  a rule with no translation is reported as an error, so a newer CRD cannot pass unchecked;
- ``format: int32/int64`` ranges; ``metadata`` is checked as ObjectMeta (a DNS-1123 subdomain name,
  a DNS-1123 label namespace, string labels and annotations), as the server does for every object.

Kubernetes rules in Go code rather than in the schema (webhooks, operators' own validation) are
the simulation's business (:mod:`k8s.operators`).
"""

from __future__ import annotations

import copy
import functools
import re
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import jsonschema
import yaml
from jsonschema import Draft4Validator, FormatChecker
from jsonschema.exceptions import ValidationError

CRD_DIR = Path(__file__).resolve().parents[3] / "shared" / "data" / "k8s-crds"
CRD_FILES = {
    ("kubeflow.org/v1", "PyTorchJob"): "kubeflow.org_pytorchjobs.yaml",
    ("kubeflow.org/v2beta1", "MPIJob"): "kubeflow.org_mpijobs.yaml",
    ("trainer.kubeflow.org/v1alpha1", "TrainJob"): "trainer.kubeflow.org_trainjobs.yaml",
    ("trainer.kubeflow.org/v1alpha1", "ClusterTrainingRuntime"): "trainer.kubeflow.org_clustertrainingruntimes.yaml",
}
DNS1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
DNS1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")

OBJECT_META = {
    "type": "object",
    "properties": {
        "name": {
            "type": "string",
            "maxLength": 253,
            "pattern": r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$",
        },
        "generateName": {"type": "string"},
        "namespace": {"type": "string", "maxLength": 63, "pattern": r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"},
        "labels": {"type": "object", "additionalProperties": {"type": "string"}},
        "annotations": {"type": "object", "additionalProperties": {"type": "string"}},
        "finalizers": {"type": "array", "items": {"type": "string"}},
    },
    "additionalProperties": False,
}
"""The part of ObjectMeta a rendered object may carry (the server fills in uid, resourceVersion...)."""


def _has(obj: Any, field: str) -> bool:
    return isinstance(obj, dict) and field in obj and obj[field] is not None


CEL_RULES: dict[str, Callable[[Any], bool]] = {
    "self >= 1": lambda s: s >= 1,
    "self == '' || self.matches('^[A-Za-z][A-Za-z0-9+.-]*://.+$')": lambda s: (
        s == "" or re.search(r"^[A-Za-z][A-Za-z0-9+.-]*://.+$", s) is not None
    ),
    "self in ['trainer.kubeflow.org/trainjob-controller', 'kueue.x-k8s.io/multikueue']": lambda s: (
        s in ("trainer.kubeflow.org/trainjob-controller", "kueue.x-k8s.io/multikueue")
    ),
    "has(self.lastUpdatedTime)": lambda s: _has(s, "lastUpdatedTime"),
    "self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')": lambda s: (
        re.search(r"^[a-z]([-a-z0-9]*[a-z0-9])?$", s["metadata"]["name"]) is not None
    ),
    "size(self.metadata.name) <= 63": lambda s: len(s["metadata"]["name"]) <= 63,
    "!self.exists(c, c == 'node')": lambda s: "node" not in s,
    "[has(self.torch), has(self.mpi), has(self.jax), has(self.xgboost),has(self.flux)].filter(x, x).size() <= 1": (
        lambda s: sum(_has(s, k) for k in ("torch", "mpi", "jax", "xgboost", "flux")) <= 1
    ),
    "self.templates.all(t, !has(t.metadata.namespace) || size(t.metadata.namespace) == 0)": lambda s: all(
        not _has(t.get("metadata"), "namespace") or len(t["metadata"]["namespace"]) == 0 for t in s["templates"]
    ),
    "!(has(self.startupPolicy) && self.startupPolicy.startupPolicyOrder == 'InOrder' && "
    "self.replicatedJobs.exists(x, has(x.dependsOn)))": lambda s: (
        not (
            _has(s, "startupPolicy")
            and s["startupPolicy"].get("startupPolicyOrder") == "InOrder"
            and any(_has(x, "dependsOn") for x in s.get("replicatedJobs", []))
        )
    ),
}
"""The CEL rules of these CRDs, each as the Python predicate it means (``self`` is the value)."""


# ---- jsonschema with the Kubernetes keywords ------------------------------------------------


def _list_type(validator, list_type, instance, schema) -> Iterator[ValidationError]:
    if not isinstance(instance, list) or list_type == "atomic":
        return
    if list_type == "set":
        seen: list[Any] = []
        for item in instance:
            if item in seen:
                yield ValidationError(f"duplicate item {item!r} in a list of type set")
            seen.append(item)
        return
    keys = schema.get("x-kubernetes-list-map-keys", [])
    item_props = schema.get("items", {}).get("properties", {})
    seen_keys: set[tuple] = set()
    for item in instance:
        if not isinstance(item, dict):
            continue
        key = tuple(item.get(k, item_props.get(k, {}).get("default")) for k in keys)
        if key in seen_keys:
            yield ValidationError(f"duplicate entry with {dict(zip(keys, key))} in a list of type map")
        seen_keys.add(key)


def _cel(validator, rules, instance, schema) -> Iterator[ValidationError]:
    for rule in rules:
        expression = rule["rule"]
        if "oldSelf" in expression:
            continue  # a transition rule: only evaluated when an existing object is updated
        check = CEL_RULES.get(" ".join(expression.split()))
        if check is None:
            yield ValidationError(f"CEL rule without a translation in tests/k8s/crd_schema.py: {expression}")
            continue
        try:
            ok = check(instance)
        except (KeyError, TypeError, AttributeError) as err:  # CEL: a missing field makes the rule fail
            ok, detail = False, f" ({type(err).__name__}: {err})"
        else:
            detail = ""
        if not ok:
            yield ValidationError(f"{rule.get('message', 'failed CEL rule')}: {expression}{detail}")


_format_checker = FormatChecker()


@_format_checker.checks("int32")
def _int32(value: object) -> bool:
    return not isinstance(value, int) or -(2**31) <= value < 2**31


@_format_checker.checks("int64")
def _int64(value: object) -> bool:
    return not isinstance(value, int) or -(2**63) <= value < 2**63


@_format_checker.checks("date-time")
def _date_time(value: object) -> bool:
    if not isinstance(value, str):
        return True
    try:
        datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return False
    return True


KubernetesValidator = jsonschema.validators.extend(
    Draft4Validator, {"x-kubernetes-list-type": _list_type, "x-kubernetes-validations": _cel}
)


def structural(node: Any) -> Any:
    """``node`` with Kubernetes' pruning made explicit, int-or-string and nullable spelled out."""
    if isinstance(node, list):
        return [structural(item) for item in node]
    if not isinstance(node, dict):
        return node
    out = {key: structural(value) for key, value in node.items() if key != "description"}
    if node.get("x-kubernetes-int-or-string") and "anyOf" not in node:
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if node.get("x-kubernetes-embedded-resource"):
        props = out.setdefault("properties", {})
        for field in ("apiVersion", "kind"):
            props.setdefault(field, {"type": "string"})
        props.setdefault("metadata", copy.deepcopy(OBJECT_META))
    if node.get("nullable"):
        out = {"anyOf": [{"type": "null"}, out]}
        return out
    is_object = node.get("type") == "object"
    if is_object and not node.get("x-kubernetes-preserve-unknown-fields") and "additionalProperties" not in node:
        out["additionalProperties"] = False  # undeclared fields are pruned by the server
    return out


@functools.cache
def crd(api_version: str, kind: str) -> dict:
    """The CRD document for ``apiVersion``/``kind``."""
    file = CRD_FILES.get((api_version, kind))
    if file is None:
        raise KeyError(f"no CRD here for {api_version} {kind}")
    return yaml.load((CRD_DIR / file).read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


@functools.cache
def _validator(api_version: str, kind: str) -> jsonschema.protocols.Validator:
    document = crd(api_version, kind)
    version = api_version.split("/")[1]
    (entry,) = [v for v in document["spec"]["versions"] if v["name"] == version]
    assert entry["served"], f"{api_version} {kind} is not served by this CRD"
    schema = structural(entry["schema"]["openAPIV3Schema"])
    schema["properties"]["metadata"] = copy.deepcopy(OBJECT_META)
    schema["required"] = sorted({*schema.get("required", []), "apiVersion", "kind", "metadata"})
    KubernetesValidator.check_schema(schema)
    return KubernetesValidator(schema, format_checker=_format_checker)


def errors(obj: dict) -> list[str]:
    """Every way ``obj`` breaks its CRD schema, as ``path: message`` lines (empty when valid)."""
    found = []
    for error in _validator(obj["apiVersion"], obj["kind"]).iter_errors(obj):
        path = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error.absolute_path) or "."
        found.append(f"{path}: {error.message}")
    return sorted(found)


def assert_valid(obj: dict) -> None:
    problems = errors(obj)
    assert not problems, f"{obj['kind']} {obj['metadata'].get('name')} breaks its CRD schema:\n" + "\n".join(problems)
