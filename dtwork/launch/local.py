"""The default launcher: engines on this machine, the controller on loopback."""

from __future__ import annotations

from collections.abc import Callable

import ipyparallel as ipp

from dtwork.launch.base import Launcher


class LocalLauncher(Launcher):
    """Engines on this machine, controller on loopback (the default)."""

    def connect(
        self, cluster: ipp.Cluster, n: int, timeout: float, submitted: Callable[[], None] = lambda: None
    ) -> ipp.Client:
        """ipyparallel's own start and wait: local engines need no queue watching."""
        return cluster.start_and_connect_sync()
