"""Fixtures for multi-node tests: two network namespaces as two nodes (see :mod:`cluster.netns`).

``two_nodes`` gives ``(a, b)``: :class:`cluster.netns.Node` objects with ``.name``, ``.addr``,
``.ifname``, ``.popen(cmd, **kw)`` and ``.run(cmd, **kw)``; they are torn down (processes stopped,
namespaces deleted) after the test. Tests using it are skipped, with the reason, where namespaces
cannot be made (not root, no iproute2); CI runs as root, so there they run.
"""

from __future__ import annotations

import pytest

from cluster.netns import netns_unavailable, node_pair


@pytest.fixture(scope="session")
def netns_skip_reason() -> str | None:
    return netns_unavailable()


@pytest.fixture
def two_nodes(netns_skip_reason):
    if netns_skip_reason:
        pytest.skip(f"two namespaced nodes cannot be made here: {netns_skip_reason}")
    with node_pair() as nodes:
        yield nodes
