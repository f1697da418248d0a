"""What ipyparallel started for one engine group: its controller and engines, the client, their log.

``engines.EngineGroup`` decides what to start and joins the ranks; this module holds the
processes and handles it gets back, and stops them all (the controller, the engines, a
scheduler's jobs), whatever state the start left them in.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from pathlib import Path

import ipyparallel as ipp

from dtwork.errors import DtworkError
from dtwork.kernel import calls
from dtwork.launch import launchers


class EngineProcesses:
    """One start's ipyparallel cluster, its client and views, and the engines' log file."""

    def __init__(self) -> None:
        self.cluster: ipp.Cluster | None = None
        self.client: ipp.Client | None = None
        self._views: dict[tuple[int, ...], ipp.DirectView] = {}  # of this client, by engine ids
        self._log: logging.Logger | None = None  # ipyparallel's messages: to log_file, not the notebook
        self.log_file: Path | None = None

    def start(
        self,
        launcher: launchers.Launcher,
        cluster_kwargs: dict[str, object],
        n: int,
        engine_timeout: int,
        on_progress: Callable[[], None],
        profile: str | None,
    ) -> ipp.Client:
        """Start the controller and ``n`` engines; return a client once they registered.

        ``on_progress`` runs once before anything is launched, then as the launcher reports.
        """
        cluster_id = str(cluster_kwargs["cluster_id"])
        self._log, self.log_file = calls.engine_log(cluster_id)
        self.cluster = ipp.Cluster(**cluster_kwargs, log=self._log)
        # The registry entry and its reaper exist before the first process: a kernel killed midway
        # through the start leaves nothing that no one ends (the reaper finds them by their mark).
        on_progress()
        try:
            self.client = launcher.connect(self.cluster, n, engine_timeout, on_progress)
        except TimeoutError as exc:
            raise DtworkError(
                f"not all {n} engines registered within {engine_timeout} s: "
                f"check the launcher (profile {profile or 'default'}; engine log: {self.log_file}) "
                "or ask for fewer ranks"
            ) from exc
        if len(self.client.ids) < n:
            raise DtworkError(
                f"only {len(self.client.ids)} of {n} engines started (engine log: {self.log_file}): "
                "ask for fewer ranks"
            )
        # Functions defined in a notebook or a test module travel by value, closures included.
        self.client[:].use_cloudpickle()
        return self.client

    def attach(self, cluster_id: str, cluster_file: str, n: int, engine_timeout: int) -> ipp.Client:
        """Connect to the running cluster ``cluster_file`` describes (a kept one); return a client
        once its ``n`` engines are known (they are registered already: this is quick)."""
        self._log, self.log_file = calls.engine_log(cluster_id)
        self.cluster = ipp.Cluster.from_file(cluster_file, log=self._log)  # shutdown_atexit off
        self.client = self.cluster.connect_client_sync()
        try:
            self.client.wait_for_engines(n, timeout=engine_timeout, block=True, interactive=False)
        except TimeoutError:
            raise DtworkError(
                f"only {len(self.client.ids)} of the kept cluster's {n} engines answer "
                f"(engine log: {self.log_file}): stop it (dtwork clusters stop {cluster_id}) and start one"
            ) from None
        self.client[:].use_cloudpickle()
        return self.client

    def view(self, client: ipp.Client, ids: tuple[int, ...]) -> ipp.DirectView:
        """A DirectView on these engines (made once per client and set of engines)."""
        view = self._views.get(ids)
        if view is None or view.client is not client:
            view = self._views[ids] = client[list(ids)]
        return view

    def pids(self) -> list[int]:
        """The controller's and the engine launchers' PIDs."""
        return calls.launched_pids(self.cluster)

    def exit_code(self, pid: int) -> int | None:
        """The exit code of an engine process its launcher has seen end (negative: a signal)."""
        return calls.exit_code(self.cluster, pid)

    def files(self) -> list[str]:
        """The files ipyparallel wrote for the cluster (its connection file)."""
        return [self.cluster.cluster_file] if self.cluster is not None and self.cluster.cluster_file else []

    def jobs(self, launcher: launchers.Launcher) -> list[str]:
        """The scheduler's jobs that run the engines (none for local engines)."""
        return launcher.jobs(self.cluster) if self.cluster is not None else []

    def registered_ids(self) -> set[int] | None:
        """The engine ids the controller knows now (None when it cannot be asked)."""
        try:
            return set(self.client.ids) if self.client is not None else None
        except Exception:
            return None

    def detach(self) -> None:
        """Let go of the cluster without stopping it (an attach that failed: it stays kept)."""
        if self.client is not None:
            with contextlib.suppress(Exception):
                self.client.close()
        self.client, self.cluster = None, None
        self._views.clear()
        if self._log is not None:
            calls.close_log(self._log)

    def stop(self, launcher: launchers.Launcher) -> None:
        """Close the client and stop the cluster (a scheduler's jobs cancelled too)."""
        if self.client is not None:
            with contextlib.suppress(Exception):
                self.client.close()
        if self.cluster is not None:
            jobs = launcher.jobs(self.cluster)
            # one at a time: stop_cluster gathers both, and an engine set that never started (a
            # scheduler that refused the job) raises there and leaves the controller running
            with contextlib.suppress(Exception):
                self.cluster.stop_engines_sync()
            with contextlib.suppress(Exception):
                self.cluster.stop_controller_sync()
            launchers.cancel(jobs)  # stop_engines' own scancel may have failed silently
        self.client = None
        self._views.clear()
        self.cluster = None
        if self._log is not None:
            calls.close_log(self._log)
