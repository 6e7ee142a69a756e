"""Kubernetes objects as YAML text, with the header that marks a file as rendered by shoal."""

from __future__ import annotations

from typing import Any

from shoal.errors import ShoalError

MANIFEST_MARKER = "# Rendered by `shoal launch k8s`"
"""First line of every manifest file shoal writes (it replaces only files that have it)."""


def to_yaml(obj: dict[str, Any], note: str = "") -> str:
    """``obj`` as a YAML document, keys in the order given, after a comment header."""
    try:
        import yaml
    except ImportError:  # pragma: no cover - pyyaml is a dependency of shoal's Kubernetes output
        raise ShoalError(
            "rendering Kubernetes YAML needs PyYAML, which is not installed", "pip install pyyaml"
        ) from None
    header = f"{MANIFEST_MARKER} ({obj['kind']} {obj['metadata']['name']})"
    lines = [header] + [f"# {line}" if line else "#" for line in note.splitlines()]
    body = yaml.safe_dump(obj, sort_keys=False, default_flow_style=False, width=100, allow_unicode=True)
    return "\n".join(lines) + "\n" + body
