"""The SSH launcher: engines started over SSH on named hosts (``--hosts host1:4,host2:4``)."""

from __future__ import annotations

import shutil
import sys

from traitlets.config import Config

from dtwork.errors import DtworkError
from dtwork.launch.base import ClusterKwargs, Launcher, controller_kwargs, this_host


class SSHLauncher(Launcher):
    """Engines started over SSH on named hosts (``--hosts host1:4,host2:4``)."""

    name = "ssh"
    remote = True

    def hosts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for item in (self.options.hosts or "").split(","):
            host, _, count = item.strip().partition(":")
            if host:
                out[host] = int(count) if count.isdigit() else 1
        return out

    def check(self, n: int) -> None:
        hosts = self.hosts()
        if not hosts:
            raise DtworkError("--launcher ssh needs the hosts: --hosts host1:4,host2:4 (engines per host)")
        if sum(hosts.values()) < n:
            raise DtworkError(f"--hosts offers {sum(hosts.values())} engine slots, fewer than -n {n}")
        if shutil.which("ssh") is None:
            raise DtworkError("--launcher ssh needs the ssh client on PATH")

    def other_hosts(self) -> str | None:
        away = [h for h in self.hosts() if not this_host(h)]
        return f"--hosts names {', '.join(away)}" if away else None

    def cluster_kwargs(self, interface: str | None) -> ClusterKwargs:
        cfg = Config({"SSHEngineSetLauncher": {"engines": self.hosts(), "remote_python": sys.executable}})
        return {"engine_launcher_class": "ssh", "config": cfg, **controller_kwargs(interface)}
