"""Two hosts for real on one machine: two network namespaces joined by a veth pair.

The "kernel" and engine 0 run in namespace A (hostname dthosta), engine 1 in namespace B
(hostname dthostb), both started by ipyparallel's own local launcher through a profile whose
engine command enters the namespace. The process group runs over the named interface dt0.
Needs root and ``ip netns``; skips with the reason otherwise.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

pytestmark = pytest.mark.netns

SUBNET = "10.213.{}.{}"


def _sh(*cmd: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, check=True, capture_output=True, text=True)


def _can_make_namespaces() -> str | None:
    if os.geteuid() != 0:
        return "needs root to create network namespaces"
    if not shutil.which("ip") or not shutil.which("unshare"):
        return "needs iproute2 (ip) and util-linux (unshare)"
    probe = f"dtprobe{os.getpid()}"
    try:
        _sh("ip", "netns", "add", probe)
        _sh("ip", "netns", "del", probe)
    except (subprocess.CalledProcessError, OSError) as exc:
        return f"cannot create network namespaces here: {getattr(exc, 'stderr', exc)}".strip()
    return None


@pytest.fixture()
def namespaces():
    reason = _can_make_namespaces()
    if reason:
        pytest.skip(reason)
    tag = os.getpid() % 10000
    a, b = f"dtA{tag}", f"dtB{tag}"
    net = tag % 250
    try:
        _sh("ip", "netns", "add", a)
        _sh("ip", "netns", "add", b)
        _sh("ip", "link", "add", f"dtva{tag}", "type", "veth", "peer", "name", f"dtvb{tag}")
        for ns, dev, host in ((a, f"dtva{tag}", 1), (b, f"dtvb{tag}", 2)):
            _sh("ip", "link", "set", dev, "netns", ns)
            _sh("ip", "-n", ns, "link", "set", dev, "name", "dt0")
            _sh("ip", "-n", ns, "addr", "add", f"{SUBNET.format(net, host)}/24", "dev", "dt0")
            _sh("ip", "-n", ns, "link", "set", "dt0", "up")
            _sh("ip", "-n", ns, "link", "set", "lo", "up")
        yield a, b, SUBNET.format(net, 1)
    finally:
        for ns in (a, b):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


WRAPPER = """#!/bin/sh
# Engine command of the profile: the 1st, 3rd... engine stays in namespace A, the others go to B.
n=$(flock {counter} sh -c 'n=$(cat {counter} 2>/dev/null || echo 0); echo $((n+1)) > {counter}; echo $n')
if [ $((n % 2)) -eq 0 ]; then
  exec {python} -m ipyparallel.engine "$@"
fi
exec ip netns exec {ns_b} unshare --uts sh -c 'hostname dthostb; exec "$0" -m ipyparallel.engine "$@"' {python} "$@"
"""

KERNEL = """
import json, os, sys, time, dtwork
from dtwork.errors import DtworkError
c = dtwork.start(n=2, profile="dtnet", interface="dt0", timeout=15, engine_timeout=20)
c.session.live = False
c.configure({"global_batch_size": 8})
print(json.dumps({"ranks": c.rank_info, "master": c.master_addr}), flush=True)
cell = '''
import torch, torch.nn as nn, torch.nn.functional as F, time
model = ctx.wrap(nn.Linear(4, 1)); opt = ctx.optimizer(model.parameters())
data = ctx.synthetic((4,), (1,), size=256)
for step, (x, y) in ctx.steps(ctx.loader(data), max_steps=STEPS):
    loss = F.mse_loss(model(x), y); ctx.backward(loss); ctx.step(opt); ctx.log(loss=loss)
    if step == 3:
        open(MARK, "a").close()
    time.sleep(0.02)  # paces the steps so two ranks leave the busy machine's cores to the rest
final = step
'''
c.run(cell.replace("STEPS", "30").replace("MARK", repr(os.devnull)), quiet=True)
print(json.dumps({"trained": c.pull("final")}), flush=True)
t0 = time.time()
try:
    c.run(cell.replace("STEPS", "100000").replace("MARK", repr(sys.argv[1])), quiet=True)
    print(json.dumps({"outcome": "finished"}), flush=True)
except DtworkError as exc:
    print(json.dumps({"outcome": "failure", "message": str(exc)[-400:], "seconds": time.time() - t0}), flush=True)
finally:
    try:
        c.stop()
    except Exception:
        pass
"""


def test_two_hosts_train_over_the_named_interface_and_a_cut_link_is_a_rank_failure(
    namespaces, tmp_path
) -> None:
    ns_a, ns_b, master = namespaces
    ipdir = tmp_path / "ipython"
    profile = ipdir / "profile_dtnet"
    profile.mkdir(parents=True)
    wrapper = tmp_path / "engine.sh"
    wrapper.write_text(WRAPPER.format(counter=tmp_path / "count", python=sys.executable, ns_b=ns_b))
    wrapper.chmod(0o755)
    (profile / "ipcluster_config.py").write_text(
        textwrap.dedent(
            f"""
            c.Cluster.controller_ip = "{master}"
            c.LocalEngineLauncher.engine_cmd = ["{wrapper}"]
            """
        )
    )
    (tmp_path / "kernel.py").write_text(KERNEL)
    underway = tmp_path / "underway"  # the ranks make it a few steps into the second trial
    env = {
        **os.environ,
        "IPYTHONDIR": str(ipdir),
        "DTWORK_HOME": str(tmp_path / "home"),
        "DTWORK_STORE": str(tmp_path / "runs.sqlite"),
    }
    cmd = [
        "ip",
        "netns",
        "exec",
        ns_a,
        "unshare",
        "--uts",
        "sh",
        "-c",
        f"hostname dthosta; exec {sys.executable} {tmp_path / 'kernel.py'} {underway}",
    ]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path, env=env
    )
    try:
        first = json.loads(proc.stdout.readline() or "{}")  # type: ignore[union-attr]
        assert first, proc.stderr.read()  # type: ignore[union-attr]
        hosts = [(r["rank"], r["hostname"], r["local_rank"]) for r in first["ranks"]]
        assert hosts == [(0, "dthosta", 0), (1, "dthostb", 0)]
        assert first["master"] == master
        assert json.loads(proc.stdout.readline())["trained"] == [29, 29]  # type: ignore[union-attr]
        _wait_for(lambda: underway.exists() or proc.poll() is not None, deadline_s=120)
        ended = proc.poll() is not None
        assert underway.exists(), proc.communicate() if ended else "no second trial under way in 120 s"
        cut = time.time()
        _sh("ip", "-n", ns_b, "link", "set", "dt0", "down")
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    last = json.loads(out.strip().splitlines()[-1])
    assert last["outcome"] == "failure", (out, err)
    assert "rank 1 failed" in err and "dthostb" in err, err
    assert time.time() - cut < 90
    assert not _processes_using(ipdir), "engines or controller left behind"


def _wait_for(condition: Callable[[], bool], deadline_s: float) -> None:
    """Poll until the condition holds or the deadline passes (the caller asserts what it needs)."""
    end = time.monotonic() + deadline_s
    while not condition() and time.monotonic() < end:
        time.sleep(0.1)


def _processes_using(ipdir: Path) -> list[int]:
    """PIDs of processes started with this test's IPYTHONDIR (its controller and engines)."""
    found = []
    for p in psutil.process_iter():
        try:
            if p.environ().get("IPYTHONDIR") == str(ipdir) and p.pid != os.getpid():
                found.append(p.pid)
        except psutil.Error:
            continue
    return found
