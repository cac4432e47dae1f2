"""One ``/metrics`` endpoint per host, shared by every sessionfold process on it.

Several schedulers, several workers (each with its pool processes) and later an API process may
run on one host with the same settings, hence the same metrics port. Binding one port per process
breaks at the second process; one port per role breaks at the second scheduler. So every process
writes its metrics into one per-host directory (prometheus_client's multiprocess mode, one file
per process and metric type) and whichever process holds the port serves the sum of all of them::

    exporter = join_host_metrics(settings.data_dir / "metrics", "127.0.0.1", 9464,
                                 role="scheduler")
    ...                                        # record metrics as usual (metrics())
    exporter.close()

What joining does, in order:

1. **Membership.** Every member holds a shared ``flock`` on ``<dir>/.members.lock`` for its whole
   life (forked children, such as Celery's pool, inherit it). A process that gets the lock
   *exclusively* knows no member is alive: it removes the files of earlier runs, so a fresh
   start counts from zero. A process that cannot get it exclusively joins the running members
   and removes nothing: a live process's files are never wiped, and the files of processes that
   died while others live are kept, so the host's counters never go down while it serves.
2. **Multiprocess mode** is switched on for the directory (before the first metric is recorded).
3. **The port.** The process tries to bind it. If it gets it, it serves the directory's sum and
   writes ``<dir>/exporter.json`` (its pid, role and URL). If not, it logs one line: who serves
   (``exporter.json`` names a live sessionfold process with that port) or that another program
   holds the port; its metrics still go to the directory.
4. **Taking over.** A process that did not get the port tries again every
   :data:`TAKEOVER_INTERVAL_S`: when the exporter exits (or the other program frees the port),
   one of the others takes over, says so in one line, and serves the same sums.

A port that cannot be bound never stops a scheduler or a worker. The directory belongs to one
host (pids identify the processes): never share the data dir between hosts.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from .metrics import (
    MetricsServer,
    enable_multiprocess,
    mark_process_dead,
    multiprocess_dir,
    process_alive,
    start_metrics_server,
)

if TYPE_CHECKING:
    from .settings import Settings

__all__ = ["EXPORTER_FILE", "TAKEOVER_INTERVAL_S", "HostMetrics", "host_metrics_dir",
           "join_host_metrics", "serving_process", "start_host_metrics"]

log = logging.getLogger(__name__)

#: How often a process without the port tries to take it over.
TAKEOVER_INTERVAL_S = 5.0
#: Written by the process that serves: who it is and where.
EXPORTER_FILE = "exporter.json"
_LOCK_FILE = ".members.lock"


@dataclass
class HostMetrics:
    """This process's membership of the host's metrics directory, and its exporter if it won
    the port. ``close()`` stops serving and leaves the directory (its files stay: its counts
    are part of the host's totals)."""

    directory: Path
    host: str
    port: int
    role: str
    takeover_interval_s: float = TAKEOVER_INTERVAL_S
    server: MetricsServer | None = None
    #: Why the last attempt to bind the port failed (None once serving).
    bind_error: OSError | None = None
    _lock_file: IO[bytes] | None = field(default=None, repr=False)
    _stop: threading.Event = field(default_factory=threading.Event, repr=False)
    _thread: threading.Thread | None = field(default=None, repr=False)
    _guard: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def url(self) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "") else self.host
        return f"http://{host}:{self.port}/metrics"

    @property
    def serving(self) -> bool:
        return self.server is not None

    def try_serve(self) -> bool:
        """Bind the port and serve now if it is free; True when this process serves."""
        with self._guard:
            if self.server is not None:
                return True
            try:
                self.server = start_metrics_server(self.port, self.host)
            except OSError as exc:  # busy, forbidden, or an address this host does not have
                self.bind_error = exc
                return False
            self.bind_error = None
            self._write_exporter_file()
            return True

    def who_serves(self) -> dict[str, Any] | None:
        """``exporter.json`` if it names a live process serving this port, else None."""
        return serving_process(self.directory, self.port)

    def close(self) -> None:
        """Stop serving (and trying to), and leave the directory."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=self.takeover_interval_s + 5)
        with self._guard:
            if self.server is not None:
                self.server.close()
                self.server = None
                with contextlib.suppress(OSError, ValueError):
                    path = self.directory / EXPORTER_FILE
                    if json.loads(path.read_text()).get("pid") == os.getpid():
                        path.unlink()
        mark_process_dead(os.getpid())  # its live gauges leave the sums; counters stay
        if self._lock_file is not None:
            self._lock_file.close()  # the lock lasts while forked children keep it open
            self._lock_file = None

    # --- internals -----------------------------------------------------------------------------

    def _write_exporter_file(self) -> None:
        info = {"pid": os.getpid(), "role": self.role, "port": self.port, "url": self.url}
        tmp = self.directory / f".{EXPORTER_FILE}.{os.getpid()}"
        tmp.write_text(json.dumps(info))
        os.replace(tmp, self.directory / EXPORTER_FILE)  # readers never see half a file

    def _start_takeover(self) -> None:
        self._thread = threading.Thread(target=self._take_over_when_free,
                                        name="sessionfold-metrics-takeover", daemon=True)
        self._thread.start()

    def _take_over_when_free(self) -> None:
        while not self._stop.wait(self.takeover_interval_s):
            if self.try_serve():
                log.info("metrics: took over serving %s for every sessionfold process using %s "
                         "(this %s, pid %d)", self.url, self.directory, self.role, os.getpid())
                return


def serving_process(directory: Path, port: int) -> dict[str, Any] | None:
    """The live sessionfold process that serves ``directory`` on ``port`` (its
    ``exporter.json``: pid, role, port, url), or None."""
    try:
        data = json.loads((Path(directory) / EXPORTER_FILE).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("port") != port:
        return None
    pid = data.get("pid")
    if not isinstance(pid, int) or not process_alive(pid):
        return None
    return data


def host_metrics_dir(settings: Settings) -> Path:
    """The host's metrics directory: ``PROMETHEUS_MULTIPROC_DIR`` when set (a parent such as
    ``sessionfold up`` hands its own to its children), else ``<data dir>/metrics``."""
    return multiprocess_dir() or settings.data_dir / "metrics"


def start_host_metrics(settings: Settings, role: str) -> HostMetrics | None:
    """What an entry point calls: join the host's metrics (None when the port is 0: off)."""
    if not settings.metrics_port:
        return None
    return join_host_metrics(host_metrics_dir(settings), settings.metrics_host,
                             settings.metrics_port, role=role)


def join_host_metrics(directory: Path, host: str, port: int, *, role: str,
                      takeover_interval_s: float = TAKEOVER_INTERVAL_S) -> HostMetrics:
    """Join the host's metrics directory, and serve it if the port is free (see the module doc).

    Call before the first metric is recorded and before forking. Never raises for a busy port.
    """
    directory = Path(directory).resolve()
    directory.mkdir(parents=True, exist_ok=True)
    member = HostMetrics(directory, host, port, role, takeover_interval_s)
    member._lock_file = _join(directory)
    enable_multiprocess(directory, clean=False)
    if member.try_serve():
        log.info("metrics: serving %s for every sessionfold process using %s (this %s, pid %d)",
                 member.url, directory, role, os.getpid())
    else:
        _say_who_serves(member)
        member._start_takeover()
    return member


def _join(directory: Path) -> IO[bytes]:
    """Become a member (shared lock); the first member of a run wipes the last run's files."""
    lock = open(directory / _LOCK_FILE, "ab")  # noqa: SIM115 (held for the process's life)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        pass  # live members: join them, touch nothing
    else:
        # Nobody holds the lock, so nobody alive writes here: start the counts afresh.
        for stale in [*directory.glob("*.db"), directory / EXPORTER_FILE]:
            with contextlib.suppress(FileNotFoundError):
                stale.unlink()
    # Converting EX to SH is not atomic; another process may wipe in the gap, which is
    # harmless: this one has written no file yet.
    fcntl.flock(lock, fcntl.LOCK_SH)
    return lock


def _say_who_serves(member: HostMetrics) -> None:
    exporter = member.who_serves()
    if exporter is None:
        # The winner of a race for the port writes exporter.json right after binding.
        threading.Event().wait(0.5)
        exporter = member.who_serves()
    if exporter is not None:
        log.info("metrics: %s is served by the %s process %s, which adds up this %s's counts "
                 "(pid %d) with every sessionfold process using %s", member.url,
                 exporter.get("role", "sessionfold"), exporter["pid"], member.role, os.getpid(),
                 member.directory)
    elif member.bind_error is not None and member.bind_error.errno == errno.EADDRINUSE:
        log.warning("metrics: port %d on %s is taken by another program (not a sessionfold "
                    "process using %s); this %s keeps its metrics there and serves them once the "
                    "port is free (set SESSIONFOLD_METRICS_PORT to move them)", member.port,
                    member.host, member.directory, member.role)
    else:
        log.warning("metrics: cannot serve on %s port %d (%s); this %s keeps working and keeps "
                    "its metrics in %s (check SESSIONFOLD_METRICS_HOST and "
                    "SESSIONFOLD_METRICS_PORT)", member.host, member.port, member.bind_error,
                    member.role, member.directory)
