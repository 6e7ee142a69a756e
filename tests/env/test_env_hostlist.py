"""Slurm host-list and per-node-count expansion."""

from __future__ import annotations

import pytest

from shoal.env.hostlist import expand_counts, expand_hostlist


@pytest.mark.parametrize(
    "text, hosts",
    [
        ("gpu[01-03,7],cpu5", ["gpu01", "gpu02", "gpu03", "gpu7", "cpu5"]),
        ("node1", ["node1"]),
        ("a,b,c", ["a", "b", "c"]),
        ("n[8-11]", ["n8", "n9", "n10", "n11"]),  # width of lo ("8") is 1: no padding
        ("n[008-010]", ["n008", "n009", "n010"]),  # zero padding kept across the carry
        ("a[1-2]-b[3-4]", ["a1-b3", "a1-b4", "a2-b3", "a2-b4"]),  # leftmost group outermost
        ("rack1-node[1,3]x", ["rack1-node1x", "rack1-node3x"]),
        ("x[1-2],y[05]", ["x1", "x2", "y05"]),
        (" gpu[1-2] ", ["gpu1", "gpu2"]),
    ],
)
def test_expand_hostlist(text, hosts):
    assert expand_hostlist(text) == hosts


@pytest.mark.parametrize(
    "text, complaint",
    [
        ("gpu[1-3", "unclosed"),
        ("gpu1-3]", "unmatched"),
        ("gpu[1-[2]]", "nested"),
        ("gpu[]", "empty brackets"),
        ("gpu[3-1]", "backwards"),
        ("gpu[a-b]", "not a number"),
        ("gpu[1-]", "not a number"),
        ("a,,b", "empty host name"),
        ("", "empty host name"),
    ],
)
def test_expand_hostlist_rejects_malformed(text, complaint):
    with pytest.raises(ValueError, match=complaint):
        expand_hostlist(text)


@pytest.mark.parametrize(
    "text, counts",
    [("4", [4]), ("2(x3),1", [2, 2, 2, 1]), ("1,3(x2)", [1, 3, 3]), ("8(x1)", [8])],
)
def test_expand_counts(text, counts):
    assert expand_counts(text) == counts


@pytest.mark.parametrize("text", ["2(x0)", "x3", "2(3)", "", "2,,1", "-1"])
def test_expand_counts_rejects_malformed(text):
    with pytest.raises(ValueError):
        expand_counts(text)
