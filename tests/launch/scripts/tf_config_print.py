"""Report the TF_CONFIG this rank got, its torchrun variables, and whether its own port could be bound
(as TensorFlow's server binds it: every interface), as one JSON line on stdout and, given a
directory, in ``DIR/rank<RANK>.json``. Usage: ``tf_config_print.py [DIR]``. No torch, no TF."""

import json
import os
import socket
import sys

config = json.loads(os.environ["TF_CONFIG"])
host, _, port = config["cluster"]["worker"][config["task"]["index"]].rpartition(":")
family = socket.AF_INET6 if host.startswith("[") else socket.AF_INET
with socket.socket(family, socket.SOCK_STREAM) as sock:
    try:
        sock.bind(("::" if family == socket.AF_INET6 else "0.0.0.0", int(port)))
        bindable = True
    except OSError:
        bindable = False
names = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "GROUP_RANK", "MASTER_ADDR", "SHOAL_TF_CONFIG")
report = json.dumps({"tf_config": config, "bindable": bindable, **{n: os.environ.get(n) for n in names}})
print(report, flush=True)
if len(sys.argv) > 1:
    with open(os.path.join(sys.argv[1], f"rank{os.environ['RANK']}.json"), "w") as f:
        f.write(report)
