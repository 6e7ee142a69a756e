"""Kubernetes objects as YAML text (with the header that marks a file as rendered by shoal), and
``kubectl apply`` of that text: how every kind's object reaches the cluster."""

from __future__ import annotations

import re
import subprocess
from typing import Any

from shoal.errors import ShoalError
from shoal.jobs.programs import require_program

MANIFEST_MARKER = "# Rendered by `shoal launch k8s`"
"""First line of every manifest file shoal writes (it replaces only files that have it)."""
KUBECTL_TIMEOUT_S = 90.0


def to_yaml(obj: dict[str, Any], note: str = "") -> str:
    """``obj`` as a YAML document, keys in the order given, after a comment header."""
    try:
        import yaml
    except ImportError:  # pragma: no cover - pyyaml is a dependency of shoal's Kubernetes output
        raise ShoalError(
            "rendering Kubernetes YAML needs PyYAML, which is not installed", "pip install pyyaml"
        ) from None

    class Plain(yaml.SafeDumper):
        """A value used twice is written twice: no ``&id001`` anchors, which few readers expect."""

        def ignore_aliases(self, data: Any) -> bool:
            return True

    header = f"{MANIFEST_MARKER} ({obj['kind']} {obj['metadata']['name']})"
    lines = [header] + [f"# {line}" if line else "#" for line in note.splitlines()]
    body = yaml.dump(obj, Dumper=Plain, sort_keys=False, default_flow_style=False, width=100, allow_unicode=True)
    return "\n".join(lines) + "\n" + body


def to_yaml_all(objects: list[dict[str, Any]], note: str = "") -> str:
    """``objects`` as one YAML stream, in order, each with its header; ``note`` on the last (the job)."""
    return "---\n".join(to_yaml(obj, note if i == len(objects) - 1 else "") for i, obj in enumerate(objects))


def kubectl_apply(manifest: str, what: str) -> str:
    """``kubectl apply -f -`` with ``manifest``; kubectl's summary line, or ShoalError naming why it failed."""
    kubectl = require_program("kubectl", "install kubectl, or add --dry-run to print the YAML")
    try:
        proc = subprocess.run(
            [kubectl, "apply", "--request-timeout=30s", "-f", "-"],
            input=manifest,
            capture_output=True,
            text=True,
            timeout=KUBECTL_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        raise ShoalError(
            f"kubectl apply of {what} did not finish within {KUBECTL_TIMEOUT_S:g} s",
            "check that the cluster answers (`kubectl cluster-info`), or add --dry-run to print the YAML",
            exit_code=1,
        ) from None
    if proc.returncode != 0:
        raise ShoalError(
            f"kubectl apply of {what} failed: {_kubectl_reason(proc.stderr, proc.returncode)}",
            "check the cluster kubectl uses (`kubectl config current-context`, `kubectl cluster-info`) and that "
            "the operator's CRDs are installed; or add --dry-run and apply the YAML where a cluster answers",
            exit_code=1,
        )
    return proc.stdout.strip()


def _kubectl_reason(stderr: str, returncode: int) -> str:
    text = " ".join(stderr.split())
    server = re.search(r'Get "(https?://[^/"]+)', text)
    if "connection refused" in text:
        return f"no Kubernetes API server answers at {server.group(1) if server else 'the configured address'}"
    lines = [line.strip() for line in stderr.strip().splitlines() if line.strip()]
    reason = lines[-1] if lines else f"exit status {returncode}"
    reason = reason.removeprefix("error: ")
    return reason if len(reason) <= 200 else reason[:197] + "..."
