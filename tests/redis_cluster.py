"""A real local Redis Cluster for tests: ``redis-server`` processes joined by ``redis-cli``.

sessionfold's own keys must work on Redis Cluster (issue 14), and the only convincing test of
that is a real cluster: several ``redis-server --cluster-enabled yes`` processes on spare ports,
joined with ``redis-cli --cluster create``, whose nodes a test can stop, kill and restart. This
module starts one in a temporary folder and tears it down whatever happens to the test::

    from redis_cluster import RedisClusterHarness, cluster_fixture

    redis_cluster = cluster_fixture()                      # 3 masters, one cluster per module
    failover_cluster = cluster_fixture(replicas=1, scope="function")

    def test_a_script_on_one_partition_runs(redis_cluster: RedisClusterHarness) -> None:
        client = redis_cluster.client()                    # a redis.cluster.RedisCluster
        ...
        node = redis_cluster.node_for_key("{p:12}state")   # the master serving that slot
        redis_cluster.restart_node(node)                   # stop, start on its port, wait ok

Without pytest::

    with RedisClusterHarness(Path("/tmp/c"), masters=3, replicas=1) as cluster:
        cluster.start()
        cluster.url            # "redis://127.0.0.1:PORT" (RedisCluster.from_url takes it)
        cluster.startup_nodes  # [redis.cluster.ClusterNode, ...] of the running nodes

What the harness guarantees, and why:

- **Spare ports, checked twice over.** A cluster node also listens on its bus port (port +
  10 000), so both must be free; a port taken between the check and the start (other tests run
  beside this one) makes that start fail, and the whole attempt is retried on new ports.
- **No persistence** (``--save ""``, ``--appendonly no``): a restarted node comes back empty,
  which is also how a test can tell that it really restarted. Its ``nodes.conf`` (the cluster
  configuration, written by the node itself) stays in its folder, so it rejoins under the same
  node id and with the same slots.
- **"Ok" means ok everywhere**, not one node's word: :meth:`RedisClusterHarness.wait_ok` waits
  until every running node reports ``cluster_state:ok`` with all 16384 slots ok, every node sees
  the same slot owners, every owner is a running process no one flags as failing, and every
  running replica's link to its master is up. Right after a master is killed the survivors
  still say "ok" until ``cluster-node-timeout`` passes; the owner check is what waits out the
  failover instead of returning early.
- **Replicas fail over.** With ``replicas=1`` a killed master's replica is promoted
  (``cluster-replica-validity-factor 0``: a replica that lagged on a loaded machine may still
  take over); restarted, the old master rejoins as a replica of the new one. Without replicas a
  stopped master leaves its slots down (``cluster_state:fail``) until it is restarted.
- **Nothing outlives the test.** :meth:`RedisClusterHarness.close` SIGKILLs every node and is
  idempotent; the fixture calls it in ``finally``, an ``atexit`` hook calls it if the test
  process exits first, and on Linux each node also gets ``PR_SET_PDEATHSIG`` so a test process
  killed outright takes its nodes with it.
- **Loaded machines.** Every wait has a generous timeout and every failure names the node's
  port and the tail of its log.

``redis-server`` and ``redis-cli`` must be on ``PATH``: without them the fixture skips locally
and fails under CI (``CI`` set), like the other real-service fixtures.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import pytest
import redis
from redis.cluster import ClusterNode, RedisCluster
from redis.crc import key_slot

__all__ = [
    "ClusterHarnessError",
    "NodeProcess",
    "NodeView",
    "RedisClusterHarness",
    "cluster_fixture",
    "command",
    "require_binaries",
]

SLOTS = 16384
HOST = "127.0.0.1"
#: The cluster bus listens on the client port plus this (fixed by Redis).
BUS_OFFSET = 10_000
_PORT_RANGE = (20_000, 55_000)  # + BUS_OFFSET stays a valid port


class ClusterHarnessError(RuntimeError):
    """The cluster (or one of its nodes) did not do what the harness waited for."""


# --- binaries ------------------------------------------------------------------------------------


def require_binaries() -> tuple[str, str]:
    """``(redis-server, redis-cli)`` paths; skips the test without them (fails under CI)."""
    server, cli = shutil.which("redis-server"), shutil.which("redis-cli")
    if server is None or cli is None:
        missing = "redis-server" if server is None else "redis-cli"
        reason = f"{missing} is not on PATH: a local Redis Cluster cannot be started"
        if os.environ.get("CI"):
            pytest.fail(f"{reason} (CI must provide it)")
        pytest.skip(reason)
    assert server is not None and cli is not None
    return server, cli


def server_version(binary: str) -> str:
    """``7.0.15`` from ``redis-server --version``."""
    out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=30,
                         check=True).stdout
    found = re.search(r"v=(\S+)", out)
    return found.group(1) if found else out.strip()


# --- ports ---------------------------------------------------------------------------------------


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((HOST, port))
        except OSError:
            return False
    return True


def spare_port(taken: set[int], rng: random.Random) -> int:
    """A port whose bus port is free too, not in ``taken`` (ports this harness holds)."""
    for _ in range(500):
        port = rng.randrange(*_PORT_RANGE)
        if port in taken or port + BUS_OFFSET in taken:
            continue
        if _bindable(port) and _bindable(port + BUS_OFFSET):
            return port
    raise ClusterHarnessError(f"no spare port pair (p, p+{BUS_OFFSET}) found in {_PORT_RANGE}")


# --- one node ------------------------------------------------------------------------------------


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL this node if the test process dies (Linux only)."""
    with contextlib.suppress(Exception):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


class NodeProcess:
    """One ``redis-server --cluster-enabled yes`` on a fixed port, with its own folder."""

    def __init__(self, binary: str, workdir: Path, port: int, node_timeout_ms: int) -> None:
        self.binary = binary
        self.workdir = workdir
        self.port = port
        self.node_timeout_ms = node_timeout_ms
        self.node_id = ""  # filled in once the node answers CLUSTER MYID
        self.proc: subprocess.Popen[bytes] | None = None

    def __repr__(self) -> str:
        state = f"pid {self.proc.pid}" if self.running and self.proc else "stopped"
        return f"NodeProcess(port={self.port}, id={self.node_id[:8] or '?'}, {state})"

    @property
    def address(self) -> str:
        return f"{HOST}:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.workdir / "redis.log"

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.running and self.proc is not None else None

    def argv(self) -> list[str]:
        return [
            self.binary, "--port", str(self.port), "--bind", HOST, "--dir", str(self.workdir),
            "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
            "--cluster-node-timeout", str(self.node_timeout_ms),
            # A replica that lagged (a loaded machine) may still be promoted.
            "--cluster-replica-validity-factor", "0",
            "--save", "", "--appendonly", "no",
            # Replicas sync over the socket at once (no RDB file, no 5 s wait for more replicas).
            "--repl-diskless-sync", "yes", "--repl-diskless-sync-delay", "0",
            "--maxmemory-policy", "noeviction", "--daemonize", "no",
        ]

    def start(self, timeout_s: float) -> None:
        """Start the process and wait until it answers PING (ClusterHarnessError otherwise)."""
        if self.running:
            return
        self.workdir.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            log.write(f"\n--- harness: starting on port {self.port}\n".encode())
            log.flush()
            self.proc = subprocess.Popen(
                self.argv(), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                # Its own session: a Ctrl-C of the test run reaches the harness, which stops it.
                start_new_session=True,
                preexec_fn=_die_with_parent if sys.platform == "linux" else None)
        deadline = time.monotonic() + timeout_s
        with self.connection(timeout_s=1.0) as client:
            while True:
                try:
                    client.ping()
                    break
                except redis.RedisError as exc:
                    if not self.running:
                        raise self.error("exited while starting") from exc
                    if time.monotonic() > deadline:
                        raise self.error(f"did not answer PING within {timeout_s:.0f} s") from exc
                    time.sleep(0.05)
            self.node_id = str(command(client, "CLUSTER", "MYID"))

    def stop(self, timeout_s: float = 30.0) -> None:
        """SIGTERM (a clean shutdown; nothing is saved), SIGKILL if it does not exit in time."""
        self._end(signal.SIGTERM, timeout_s)

    def kill(self) -> None:
        """SIGKILL, as a crash or a lost host would end it."""
        self._end(signal.SIGKILL, 30.0)

    def _end(self, sig: signal.Signals, timeout_s: float) -> None:
        proc = self.proc
        if proc is None:
            return
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(sig)
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=30)
        self.proc = None

    @contextlib.contextmanager
    def connection(self, timeout_s: float = 5.0) -> Iterator[redis.Redis]:
        """A plain (non-cluster) client on this node alone, closed after the block."""
        client = redis.Redis(host=HOST, port=self.port, decode_responses=True,
                             socket_timeout=timeout_s, socket_connect_timeout=timeout_s)
        try:
            yield client
        finally:
            client.close()

    def log_tail(self, lines: int = 25) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def error(self, what: str) -> ClusterHarnessError:
        return ClusterHarnessError(
            f"redis node on port {self.port} ({self.workdir}) {what}; its log ends:\n"
            f"{self.log_tail()}")


# --- one node's view of the cluster --------------------------------------------------------------


@dataclass(frozen=True)
class NodeView:
    """One line of ``CLUSTER NODES``: a node as some node sees it."""

    node_id: str
    port: int
    flags: frozenset[str]
    master_id: str | None
    connected: bool
    slots: tuple[tuple[int, int], ...]

    @property
    def is_master(self) -> bool:
        return "master" in self.flags

    @property
    def failing(self) -> bool:
        return bool(self.flags & {"fail", "fail?", "handshake", "noaddr"})


def parse_cluster_nodes(text: str) -> list[NodeView]:
    """The lines of ``CLUSTER NODES`` (migrating/importing slot markers are left out)."""
    views = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) < 8:
            continue
        address = parts[1].split("@", 1)[0].split(",", 1)[0]
        port = int(address.rsplit(":", 1)[1]) if ":" in address else 0
        slots = []
        for token in parts[8:]:
            if token.startswith("["):
                continue
            low, _, high = token.partition("-")
            slots.append((int(low), int(high or low)))
        views.append(NodeView(node_id=parts[0], port=port, flags=frozenset(parts[2].split(",")),
                              master_id=None if parts[3] == "-" else parts[3],
                              connected=parts[7] == "connected", slots=tuple(sorted(slots))))
    return views


def command(client: redis.Redis, *args: Any) -> Any:
    """``client.execute_command(*args)``, typed (redis-py leaves it untyped)."""
    return client.execute_command(*args)  # type: ignore[no-untyped-call]


def _text(output: str | bytes | None) -> str:
    if isinstance(output, bytes):
        return output.decode(errors="replace")
    return output or ""


def _info_fields(text: str) -> dict[str, str]:
    return dict(line.split(":", 1) for line in text.splitlines() if ":" in line)


# --- the cluster ---------------------------------------------------------------------------------

_LIVE: weakref.WeakSet[RedisClusterHarness] = weakref.WeakSet()
_LIVE_LOCK = threading.Lock()


@atexit.register
def _close_all() -> None:
    """A test process exiting with a cluster still up (an interrupted run) stops it."""
    with _LIVE_LOCK:
        harnesses = list(_LIVE)
    for harness in harnesses:
        harness.close()


class RedisClusterHarness:
    """``masters`` masters (each with ``replicas`` replicas) on spare ports under ``workdir``.

    ``node_timeout_ms`` is the nodes' ``cluster-node-timeout``: how long a node must be
    unreachable before it is marked failed (and, with replicas, failed over). Short enough for a
    test to wait out, long enough that a busy machine does not flap nodes. ``start_attempts``:
    how many times a cluster that failed to form is thrown away and tried again on new ports.
    """

    def __init__(self, workdir: Path, *, masters: int = 3, replicas: int = 0,
                 node_timeout_ms: int = 3000, start_timeout_s: float = 60.0,
                 ok_timeout_s: float = 90.0, start_attempts: int = 3,
                 seed: int | None = None) -> None:
        if masters < 3:
            raise ValueError(f"redis-cli --cluster create needs at least 3 masters, got {masters}")
        if replicas < 0:
            raise ValueError(f"replicas must be >= 0, got {replicas}")
        self.workdir = workdir
        self.masters = masters
        self.replicas = replicas
        self.node_timeout_ms = node_timeout_ms
        self.start_timeout_s = start_timeout_s
        self.ok_timeout_s = ok_timeout_s
        self.start_attempts = start_attempts
        self.nodes: list[NodeProcess] = []
        self._rng = random.Random(seed)
        self._attempt = 0
        self._binaries: tuple[str, str] | None = None

    def __repr__(self) -> str:
        return (f"RedisClusterHarness(masters={self.masters}, replicas={self.replicas}, "
                f"ports={[n.port for n in self.nodes]})")

    def __enter__(self) -> RedisClusterHarness:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- lifecycle ------------------------------------------------------------------------------

    @property
    def binaries(self) -> tuple[str, str]:
        if self._binaries is None:
            server, cli = shutil.which("redis-server"), shutil.which("redis-cli")
            if server is None or cli is None:
                raise ClusterHarnessError("redis-server and redis-cli must be on PATH")
            self._binaries = (server, cli)
        return self._binaries

    def start(self) -> None:
        """Start the nodes, join them into a cluster, and wait until it is ok everywhere."""
        with _LIVE_LOCK:
            _LIVE.add(self)
        failures: list[str] = []
        for _ in range(self.start_attempts):
            try:
                self._start_once()
                return
            except ClusterHarnessError as exc:
                failures.append(str(exc))
                self._kill_all()
        self.close()
        raise ClusterHarnessError(
            f"the cluster did not form in {self.start_attempts} attempts:\n\n"
            + "\n\n".join(failures))

    def _start_once(self) -> None:
        self._attempt += 1
        server, _ = self.binaries
        taken: set[int] = set()
        self.nodes = []
        for _ in range(self.masters * (1 + self.replicas)):
            port = spare_port(taken, self._rng)
            taken |= {port, port + BUS_OFFSET}
            folder = self.workdir / f"attempt-{self._attempt}" / f"node-{port}"
            self.nodes.append(NodeProcess(server, folder, port, self.node_timeout_ms))
        for node in self.nodes:
            node.start(self.start_timeout_s)
        self._create()
        self.wait_ok()

    def _create(self) -> None:
        _, cli = self.binaries
        argv = [cli, "--cluster", "create", *(n.address for n in self.nodes),
                "--cluster-replicas", str(self.replicas), "--cluster-yes"]
        try:
            done = subprocess.run(argv, capture_output=True, text=True, stdin=subprocess.DEVNULL,
                                  timeout=max(120.0, self.ok_timeout_s))
        except subprocess.TimeoutExpired as exc:
            raise ClusterHarnessError(
                f"`{' '.join(argv[1:])}` did not finish in {exc.timeout:.0f} s:\n"
                f"{_text(exc.stdout)}{_text(exc.stderr)}") from None
        output = done.stdout + done.stderr
        if done.returncode != 0 or "[OK] All 16384 slots covered" not in output:
            tails = "\n".join(f"[port {n.port}] {n.log_tail(5)}" for n in self.nodes)
            raise ClusterHarnessError(
                f"redis-cli --cluster create failed (exit {done.returncode}):\n"
                f"{output[-3000:]}\nnode logs:\n{tails}")

    def close(self) -> None:
        """SIGKILL every node (idempotent; the folders stay for a failed test's inspection)."""
        self._kill_all()
        with _LIVE_LOCK:
            _LIVE.discard(self)

    def _kill_all(self) -> None:
        for node in self.nodes:
            with contextlib.suppress(Exception):
                node.kill()

    # --- what tests connect to ------------------------------------------------------------------

    @property
    def running_nodes(self) -> list[NodeProcess]:
        return [n for n in self.nodes if n.running]

    @property
    def startup_nodes(self) -> list[ClusterNode]:
        """The running nodes, for ``RedisCluster(startup_nodes=...)``."""
        return [ClusterNode(HOST, n.port)  # type: ignore[no-untyped-call]
                for n in self.running_nodes]

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:PORT`` of a running node (``RedisCluster.from_url`` finds all)."""
        running = self.running_nodes
        if not running:
            raise ClusterHarnessError("no node of the cluster is running")
        return f"redis://{running[0].address}"

    def client(self, **kwargs: Any) -> RedisCluster:
        """A ``redis.cluster.RedisCluster`` on the running nodes (``decode_responses`` on)."""
        options: dict[str, Any] = {"decode_responses": True, "socket_timeout": 5.0,
                                   "socket_connect_timeout": 2.0}
        options.update(kwargs)
        return RedisCluster(startup_nodes=self.startup_nodes, **options)

    # --- topology -------------------------------------------------------------------------------

    def view(self, node: NodeProcess | None = None) -> list[NodeView]:
        """``CLUSTER NODES`` as seen by ``node`` (default: the first running node)."""
        node = node or self._any_running()
        with node.connection() as client:
            return parse_cluster_nodes(str(command(client, "CLUSTER", "NODES")))

    def node_by_id(self, node_id: str) -> NodeProcess:
        for node in self.nodes:
            if node.node_id == node_id:
                return node
        raise ClusterHarnessError(f"no node of this harness has id {node_id}")

    def masters_now(self) -> list[NodeProcess]:
        """The nodes that are masters now (after a failover, not the ones created as such)."""
        return [self.node_by_id(v.node_id) for v in self.view() if v.is_master and not v.failing]

    def replicas_of(self, master: NodeProcess) -> list[NodeProcess]:
        return [self.node_by_id(v.node_id) for v in self.view()
                if v.master_id == master.node_id and not v.failing]

    def slot_owner(self, slot: int) -> NodeProcess:
        for view in self.view():
            if view.is_master and any(lo <= slot <= hi for lo, hi in view.slots):
                return self.node_by_id(view.node_id)
        raise ClusterHarnessError(f"no master serves slot {slot}")

    def node_for_key(self, key: str | bytes) -> NodeProcess:
        """The master serving ``key``'s slot (hash tags honoured)."""
        raw = key.encode() if isinstance(key, str) else key
        return self.slot_owner(key_slot(raw))

    def _any_running(self) -> NodeProcess:
        running = self.running_nodes
        if not running:
            raise ClusterHarnessError("no node of the cluster is running")
        return running[0]

    # --- faults ---------------------------------------------------------------------------------

    def stop_node(self, node: NodeProcess) -> None:
        """Stop ``node`` cleanly. Does not wait: see :meth:`wait_ok`."""
        node.stop()

    def kill_node(self, node: NodeProcess) -> None:
        """SIGKILL ``node``. With replicas, :meth:`wait_ok` then waits out the failover."""
        node.kill()

    def start_node(self, node: NodeProcess, *, wait: bool = True) -> None:
        """Start a stopped node on its own port again (same folder, so the same node id)."""
        old_id = node.node_id
        node.start(self.start_timeout_s)
        if old_id and node.node_id != old_id:
            raise node.error(f"came back as node {node.node_id}, not {old_id} (nodes.conf lost?)")
        if wait:
            self.wait_ok()

    def restart_node(self, node: NodeProcess, *, kill: bool = False,
                     down_s: float = 0.0) -> None:
        """Stop (or SIGKILL) ``node``, keep it down ``down_s``, start it, wait until ok."""
        (node.kill if kill else node.stop)()
        if down_s > 0:
            time.sleep(down_s)
        self.start_node(node)

    # --- health ---------------------------------------------------------------------------------

    def wait_ok(self, timeout_s: float | None = None) -> None:
        """Wait until the cluster is ok on every running node (see the module doc)."""
        timeout_s = self.ok_timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + timeout_s
        while True:
            problem = self.problem()
            if problem is None:
                return
            if time.monotonic() > deadline:
                logs = "\n".join(f"[port {n.port}{'' if n.running else ', stopped'}] "
                                 f"{n.log_tail(8)}" for n in self.nodes)
                raise ClusterHarnessError(
                    f"the cluster on ports {[n.port for n in self.nodes]} was not ok after "
                    f"{timeout_s:.0f} s: {problem}\nnode logs:\n{logs}")
            time.sleep(0.1)

    def problem(self) -> str | None:
        """What keeps the cluster from being ok right now, or None when it is."""
        running = self.running_nodes
        if not running:
            return "no node is running"
        running_ids = {n.node_id for n in running}
        topologies: set[tuple[tuple[str, str, str | None, tuple[tuple[int, int], ...]], ...]]
        topologies = set()
        for node in running:
            try:
                with node.connection(timeout_s=2.0) as client:
                    info = _info_fields(str(command(client, "CLUSTER", "INFO")))
                    views = parse_cluster_nodes(str(command(client, "CLUSTER", "NODES")))
                    replication = _info_fields(str(command(client, "INFO", "replication")))
            except redis.RedisError as exc:
                return f"node {node.port} does not answer ({exc})"
            problem = self._node_problem(node, info, views, replication, running_ids)
            if problem:
                return problem
            topologies.add(tuple(sorted(
                (v.node_id, "master" if v.is_master else "replica", v.master_id, v.slots)
                for v in views if v.node_id in running_ids)))
        if len(topologies) > 1:
            return "the nodes do not agree on the roles and slots of the running nodes yet"
        return None

    def _node_problem(self, node: NodeProcess, info: dict[str, str], views: list[NodeView],
                      replication: dict[str, str], running_ids: set[str]) -> str | None:
        """What ``node``'s own reports say is not ok yet, or None."""
        if info.get("cluster_state") != "ok":
            return f"node {node.port} reports cluster_state:{info.get('cluster_state')}"
        if info.get("cluster_slots_ok") != str(SLOTS):
            return f"node {node.port} has {info.get('cluster_slots_ok')} slots ok"
        if info.get("cluster_known_nodes") != str(len(self.nodes)):
            return (f"node {node.port} knows {info.get('cluster_known_nodes')} of "
                    f"{len(self.nodes)} nodes")
        for view in views:
            running = view.node_id in running_ids
            if running and (view.failing or not view.connected):
                return f"node {node.port} sees node {view.port} as {','.join(sorted(view.flags))}"
            if view.is_master and view.slots and not running:
                return (f"node {node.port} has slots served by node {view.port}, which is not "
                        "running (failover pending)")
            if running and view.is_master and not view.slots:
                # Just created (CLUSTER REPLICATE not seen yet) or just rejoined (not yet told
                # it lost its slots): it will be a replica.
                return f"node {node.port} sees node {view.port} as a master without slots"
        if replication.get("role") == "slave" and (
                replication.get("master_link_status") != "up"
                or replication.get("master_sync_in_progress") != "0"):
            return f"replica {node.port}: its link to its master is not up yet"
        return None


# --- pytest ---------------------------------------------------------------------------------------


Scope = Literal["session", "package", "module", "class", "function"]


def cluster_fixture(*, masters: int = 3, replicas: int = 0, scope: Scope = "module",
                    **options: Any) -> Callable[..., Iterator[RedisClusterHarness]]:
    """A pytest fixture yielding a started :class:`RedisClusterHarness`, closed afterwards.

    Assign it to a name in a test module (the name is the fixture's)::

        redis_cluster = cluster_fixture()                                  # module scope
        failover_cluster = cluster_fixture(replicas=1, scope="function")  # a test that kills

    Tests that stop or kill nodes should use a function-scoped cluster of their own, so the
    next test starts on a whole one. ``options`` go to :class:`RedisClusterHarness`.
    """

    @pytest.fixture(scope=scope)
    def fixture(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisClusterHarness]:
        require_binaries()
        harness = RedisClusterHarness(tmp_path_factory.mktemp("redis-cluster"),
                                      masters=masters, replicas=replicas, **options)
        try:
            harness.start()
            yield harness
        finally:
            harness.close()

    return fixture
