"""What a namespaced node (hostname resolving to 127.0.0.1, a veth as its only way out) picks as its
route, address and interface toward each possible master (:func:`shoal.env.network.route_to`)."""

from __future__ import annotations

import json
import socket
import sys

import pytest

PROBE = """\
import json, socket, sys
from shoal.env import network
out = {}
for target in sys.argv[1:]:
    try:
        r = network.route_to(target)
        out[target] = [r.addr, r.ifname, r.master_is_local, r.loopback, r.why]
    except Exception as err:
        out[target] = ['error', getattr(err, 'message', str(err))]
out['hostname'] = socket.gethostname()
print(json.dumps(out))
"""


@pytest.mark.multiprocess
def test_what_a_namespaced_node_picks(two_nodes):
    a, b = two_nodes
    hostname = socket.gethostname()
    targets = [a.addr, b.addr, "10.77.0.9", "10.77.5.1", hostname, "no-such-host.invalid"]
    proc = b.run([sys.executable, "-c", PROBE, *targets], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    seen = json.loads(proc.stdout)
    assert seen[a.addr] == [b.addr, b.ifname, False, False, f"the interface that routes to the master {a.addr}"]
    assert seen[b.addr] == [b.addr, b.ifname, True, False, f"the master {b.addr} is this node's own address"]
    assert seen["10.77.0.9"][:3] == [b.addr, b.ifname, False]  # on the link, even if nobody is there
    assert seen["10.77.5.1"] == [
        "error",
        "no route from this node to the master 10.77.5.1 (10.77.5.1): Network is unreachable",
    ]
    # The hostname resolves to loopback here: this node's own name; the veth is its only way out.
    assert seen[hostname][:4] == [b.addr, b.ifname, True, False], seen
    assert seen["no-such-host.invalid"][0] == "error"
    assert "cannot resolve the master address 'no-such-host.invalid'" in seen["no-such-host.invalid"][1]
