"""tests/warm.py starts the tests' ``python -m shoal`` commands as forks of a process that imported torch
and shoal once: a command must give the same result warm as fresh, and the cases that could differ
must start fresh."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys

import pytest

import warm
from cluster.pods import PodSpec, pod_network, pods_unavailable
from conftest import session_environ, shoal_cmd
from procs import wait_for
from shoal.launch.watchdog.processes import alive

HANG_GUARD_S = 240
"""How long a command here may take before the test calls it hung: a guard, not a speed bound (each
starts an interpreter that imports torch, which took over 60 s on a 2-core machine at load 25).
pytest's own timeout (300 s) stops the test beyond it."""

pytestmark = pytest.mark.multiprocess


def _both(args: list[str], env: dict[str, str], cwd) -> tuple[subprocess.CompletedProcess, subprocess.CompletedProcess]:
    cmd = shoal_cmd(*args)
    assert warm.starts_warm(cmd, env=env)
    started = warm.run(cmd, capture_output=True, text=True, timeout=HANG_GUARD_S, env=env, cwd=cwd)
    fresh = subprocess.run(cmd, capture_output=True, text=True, timeout=HANG_GUARD_S, env=env, cwd=cwd)
    return started, fresh


@pytest.mark.parametrize(
    "args",
    [
        ["--version"],
        ["env", "--json"],
        ["train", "imagenet"],  # a one-line error and its HINT, exit 2
        ["train", "digits", "--nproc", "0"],
        ["status", "no-such-run"],
    ],
)
def test_a_command_gives_the_same_result_warm_and_fresh(args, tmp_path):
    torchrun = {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "10.77.9.9"}
    env = {**os.environ, **torchrun, "MASTER_PORT": "29500"}
    env.pop("SHOAL_ENV", None)
    started, fresh = _both(args, env, tmp_path)
    assert (started.returncode, started.stdout, started.stderr) == (fresh.returncode, fresh.stdout, fresh.stderr)
    if args == ["env", "--json"]:  # the command saw the environment it was given, not the server's
        seen = json.loads(started.stdout)
        assert (seen["rank"], seen["world_size"], seen["scheme"]) == (3, 4, "torchrun"), seen


DRIVER = """
import json, os, site, sys, tempfile
import torch
print(json.dumps({"argv": sys.argv, "path0": sys.path[0], "cwd": os.getcwd(), "name": __name__,
                  "file": globals().get("__file__"), "sum": torch.ones(3).sum().item(),
                  "tmp": tempfile.gettempdir(), "home": os.path.expanduser("~"), "user_base": site.getuserbase()}))
raise SystemExit(int(sys.argv[-1])) if sys.argv[-1].isdigit() else ValueError(sys.argv[-1])
"""


@pytest.mark.parametrize(("how", "end"), [("script", "boom"), ("code", "3")])
def test_a_driver_script_opted_in_gives_the_same_result_warm_and_fresh(how, end, tmp_path):
    """``python SCRIPT`` and ``python -c CODE`` start warm only with ``script=True``, and then as the
    interpreter runs them: argv, sys.path[0], __name__, __file__, directory, exit code, traceback; and
    with a TMPDIR and HOME of its own, which the server's imports had cached (tests/warm_server.py
    resets those caches), on the server of this process's environment."""
    (tmp_path / "driver.py").write_text(DRIVER)
    (tmp_path / "tmp").mkdir()
    env = {**os.environ, "TMPDIR": str(tmp_path / "tmp"), "HOME": str(tmp_path / "home")}
    cmd = [sys.executable, "driver.py", "x", end] if how == "script" else [sys.executable, "-c", DRIVER, "x", end]
    assert not warm.starts_warm(cmd) and warm.starts_warm(cmd, script=True)
    proc = warm.popen(
        cmd, script=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path, env=env
    )
    assert isinstance(proc, warm.WarmProcess)  # warm at once: TMPDIR and HOME need no server of their own
    out, err = proc.communicate(timeout=HANG_GUARD_S)
    started = subprocess.CompletedProcess(cmd, proc.returncode, out, err)
    fresh = subprocess.run(cmd, capture_output=True, text=True, timeout=HANG_GUARD_S, cwd=tmp_path, env=env)
    assert (started.returncode, started.stdout, started.stderr) == (fresh.returncode, fresh.stdout, fresh.stderr)
    seen = json.loads(started.stdout)
    assert started.returncode == {"3": 3, "boom": 1}[end] and seen["sum"] == 3.0
    assert (seen["tmp"], seen["home"]) == (env["TMPDIR"], env["HOME"]) and seen["user_base"].startswith(env["HOME"])
    assert end != "boom" or started.stderr.rstrip().endswith("ValueError: boom")


def test_a_variable_that_reports_on_imports_starts_the_command_fresh(tmp_path):
    env = {**os.environ, "PYTHONPROFILEIMPORTTIME": "1"}
    cmd = shoal_cmd("--version")
    assert not warm.starts_warm(cmd, env=env)
    proc = warm.popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert isinstance(proc, subprocess.Popen)
    _, err = proc.communicate(timeout=HANG_GUARD_S)
    assert "import time:" in err  # a real interpreter's start-up, not the server's
    assert not warm.starts_warm([sys.executable, "script.py"])
    assert not warm.starts_warm(cmd, stdin=subprocess.PIPE)
    given = warm.run(
        [sys.executable, "-c", "import sys; print(sys.stdin.read())"], input="to stdin", capture_output=True, text=True
    )
    assert given.stdout == "to stdin\n"


def test_a_warm_command_has_its_own_session_signals_and_timeout(tmp_path):
    script = tmp_path / "sleep.py"
    script.write_text("import time\ntime.sleep(60)\n")
    proc = warm.popen(
        shoal_cmd("run", "--nproc", "1", str(script)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    assert isinstance(proc, warm.WarmProcess)
    assert os.getpgid(proc.pid) == proc.pid == os.getsid(proc.pid)
    with pytest.raises(subprocess.TimeoutExpired):
        proc.wait(timeout=0.5)
    os.killpg(proc.pid, signal.SIGTERM)
    out, err = proc.communicate(timeout=HANG_GUARD_S)
    assert proc.returncode != 0 and proc.poll() == proc.returncode, err
    with pytest.raises(subprocess.TimeoutExpired):
        warm.run(shoal_cmd("run", "--nproc", "1", str(script)), capture_output=True, text=True, timeout=3)


def _script_for_a_pod(tmp_path, code: str):
    """tmp_path/where.py holding ``code`` (the test skips where pods cannot be made)."""
    reason = pods_unavailable()
    if reason:
        pytest.skip(reason)
    script = tmp_path / "where.py"
    script.write_text(code)
    return script


def test_a_warm_command_in_a_pod_runs_in_the_pods_namespaces(tmp_path):
    """Its workers, which it starts, see the pod's host name, address and private /run, as under nsenter."""
    script = _script_for_a_pod(
        tmp_path,
        "import os, socket\n"
        "print(socket.gethostname(), socket.gethostbyname(socket.gethostname()), os.path.isdir('/run/sshd'))\n",
    )
    env = {k: v for k, v in os.environ.items() if k != "SHOAL_ENV"}
    cmd = shoal_cmd("run", "--nproc", "1", str(script))
    with pod_network([PodSpec("w0")]) as net:
        pod = net["w0"]
        started = pod.run(cmd, capture_output=True, text=True, timeout=HANG_GUARD_S, env=env)
        fresh = subprocess.run(pod.cmd(cmd), capture_output=True, text=True, timeout=HANG_GUARD_S, env=env)
    assert started.returncode == fresh.returncode == 0, started.stderr + fresh.stderr
    assert started.stdout.split() == fresh.stdout.split() == ["w0", pod.addr, "True"], started.stdout
    assert socket.gethostname() != "w0"


def test_the_console_script_in_a_pod_with_the_images_environment_starts_warm_as_it_runs_fresh(tmp_path):
    """A pod's container command (``shoal run ...``, with the image's PYTHONUNBUFFERED, LANG and
    LD_LIBRARY_PATH) gets a server started with that environment by the script's own interpreter:
    the worker it starts sees the same interpreter, host and unbuffered streams as under nsenter."""
    script = _script_for_a_pod(
        tmp_path,
        "import os, socket, sys\n"
        "print(sys.executable, socket.gethostname(), os.environ.get('PYTHONUNBUFFERED'), os.environ.get('LANG'))\n",
    )
    image = {"PYTHONUNBUFFERED": "1", "LANG": "C.UTF-8", "LD_LIBRARY_PATH": "/usr/local/nvidia/lib"}
    env = {**{k: v for k, v in os.environ.items() if k != "SHOAL_ENV"}, **image}
    env["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), env.get("PATH", "")])
    cmd = ["shoal", "run", "--nproc", "1", str(script)]
    assert warm.starts_warm(cmd, env=env) and not warm.starts_warm(["shoal-other", "--version"], env=env)
    results = []
    with pod_network([PodSpec("w1")]) as net:
        # The first commands of an environment start fresh, then its server's (at once if another
        # xdist worker has started that server: tests/warm.py, share_servers).
        fresh = 0 if warm.server_running(cmd, env=env) else warm.FRESH_BEFORE_A_SERVER
        for expected in [subprocess.Popen] * fresh + [warm.WarmProcess]:
            proc = net["w1"].popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            assert isinstance(proc, expected)
            out, err = proc.communicate(timeout=HANG_GUARD_S)
            assert proc.returncode == 0, err
            launcher = [  # the launcher's own lines, but for the free port each picked
                re.sub(r":\d+ \(free port", ":PORT (free port", line)
                for line in err.splitlines()
                if line.startswith("shoal")
            ]
            results.append((out.split(), launcher))
    interpreter = warm.CONSOLE_SCRIPT.read_text().splitlines()[0][2:]
    assert results[0] == results[-1] and results[0][0] == [interpreter, "w1", "1", "C.UTF-8"], results


def test_torchrun_starts_warm_and_its_worker_sees_what_it_sees_fresh(tmp_path):
    """``python -m torch.distributed.run`` (the Horovod-style tests' reference launcher) warm: the same
    exit, the same worker environment, and nothing on stderr that a fresh torchrun does not print."""
    script = tmp_path / "who.py"
    script.write_text(
        "import os, sys\n"
        "print(os.path.basename(sys.argv[0]), os.environ['RANK'], os.environ['WORLD_SIZE'], "
        "os.environ['LOCAL_WORLD_SIZE'], 'TORCHELASTIC_RUN_ID' in os.environ)\n"
    )
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1", str(script)]
    env = {k: v for k, v in os.environ.items() if k != "SHOAL_ENV"}
    assert warm.starts_warm(cmd, env=env)
    started = warm.run(cmd, capture_output=True, text=True, timeout=HANG_GUARD_S, env=env, cwd=tmp_path)
    fresh = subprocess.run(cmd, capture_output=True, text=True, timeout=HANG_GUARD_S, env=env, cwd=tmp_path)
    assert started.returncode == fresh.returncode == 0, started.stderr + fresh.stderr
    assert started.stdout == fresh.stdout == "who.py 0 1 1 True\n"
    # runpy warns (RuntimeWarning) when the module it runs was imported already, as the server had it
    assert started.stderr.count("Warning") == fresh.stderr.count("Warning"), started.stderr


SHARER = """
import os, subprocess, sys
sys.path.insert(0, {tests!r})
import warm
warm.share_servers(sys.argv[1])
for line in sys.stdin:  # "run": a command, warm if it can, that prints its parent (the server); "exit"
    if line.strip() == "exit":
        break
    proc = warm.popen([sys.executable, "-c", "import os; print(os.getppid())"], script=True,
                      stdout=subprocess.PIPE, text=True)
    out, _ = proc.communicate(timeout={guard})
    print(proc.returncode, out.strip(), type(proc).__name__, flush=True)
"""


def test_processes_given_one_directory_share_a_server_that_lives_while_any_of_them_does(tmp_path):
    """What xdist's workers do (tests/conftest.py): the second process's command runs on the server the
    first started, the server outlives its starter while the other still holds it, ends once neither
    does, and the directory then holds nothing that runs."""
    directory = tmp_path / "servers"
    directory.mkdir()
    code = SHARER.format(tests=str(os.path.dirname(os.path.abspath(warm.__file__))), guard=HANG_GUARD_S)
    env = session_environ()
    sharers = [
        subprocess.Popen(
            [sys.executable, "-c", code, str(directory)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )  # fmt: skip
        for _ in range(2)
    ]
    try:

        def ask(proc: subprocess.Popen) -> tuple[str, str, str]:
            proc.stdin.write("run\n")
            proc.stdin.flush()
            return tuple(proc.stdout.readline().split())

        first, second = sharers
        code_a, server, kind_a = ask(first)  # starts the server
        code_b, server_b, kind_b = ask(second)  # leases it: no server of its own
        assert (code_a, code_b, kind_a, kind_b) == ("0", "0", "WarmProcess", "WarmProcess")
        assert server_b == server and len(list(directory.glob("*.pid"))) == 1
        first.stdin.write("exit\n")
        first.stdin.close()
        assert first.wait(timeout=30) == 0
        assert ask(second)[:2] == ("0", server)  # its starter has ended; it serves the other
        second.stdin.write("exit\n")
        second.stdin.close()
        assert second.wait(timeout=30) == 0
        wait_for(lambda: not alive(int(server)), timeout=10)  # else: the server outlived every sharer
    finally:
        for proc in sharers:
            proc.kill()
            proc.wait()
        warm.stop_shared_servers(str(directory))
    assert not directory.exists()
