"""The local Redis Cluster harness (tests/redis_cluster.py) gives a real cluster.

What later cluster tests rely on, each shown against the servers themselves: the cluster forms
with every slot served, one hash tag means one slot on one node, a multi-key script on one tag
runs, a script across slots is refused by the server (CROSSSLOT — so the cluster is real, not a
single Redis answering everything), a node restart is survived by a client that was connected
before it, a killed master fails over to its replica, and nothing is left running afterwards.
"""

from __future__ import annotations

import itertools
import os
from pathlib import Path

import pytest
from redis.cluster import RedisCluster
from redis.crc import key_slot
from redis.exceptions import ClusterCrossSlotError, MovedError
from redis_cluster import (
    SLOTS,
    RedisClusterHarness,
    cluster_fixture,
    command,
    require_binaries,
)

pytestmark = pytest.mark.redis

redis_cluster = cluster_fixture()  # shared by the tests that leave every node running
own_cluster = cluster_fixture(scope="function")
failover_cluster = cluster_fixture(replicas=1, scope="function")

# Move one unit from KEYS[1] to KEYS[2] only if KEYS[1] still holds ARGV[1] (else -1): a
# compare-and-set over two keys, the shape of the scheduler's batched script on one partition.
MOVE_ONE = """
local have = tonumber(redis.call('GET', KEYS[1]) or '0')
if have ~= tonumber(ARGV[1]) then return -1 end
redis.call('DECR', KEYS[1])
return redis.call('INCR', KEYS[2])
"""


def _process_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_the_cluster_forms_with_every_slot_served_by_exactly_one_of_its_masters(
        redis_cluster: RedisClusterHarness) -> None:
    views = redis_cluster.view()
    masters = [v for v in views if v.is_master]
    assert len(masters) == 3
    covered = sorted(r for m in masters for r in m.slots)
    assert covered[0][0] == 0 and covered[-1][1] == SLOTS - 1
    assert sum(hi - lo + 1 for lo, hi in covered) == SLOTS
    assert all(a[1] + 1 == b[0] for a, b in itertools.pairwise(covered))
    assert {n.port for n in redis_cluster.nodes} == {v.port for v in views}
    assert redis_cluster.problem() is None
    assert redis_cluster.client().ping()
    from_url = RedisCluster.from_url(redis_cluster.url)
    nodes = from_url.get_nodes()  # type: ignore[no-untyped-call]
    assert {n.port for n in nodes} == {n.port for n in redis_cluster.nodes}
    from_url.close()


def test_keys_with_the_same_hash_tag_land_in_one_slot_on_one_node(
        redis_cluster: RedisClusterHarness) -> None:
    client = redis_cluster.client()
    keys = [f"{{p:7}}{name}" for name in ("state", "measured", "lock", "spend")]
    for key in keys:
        client.set(key, "1")
    slot = key_slot(keys[0].encode())
    owner = redis_cluster.node_for_key(keys[0])
    with owner.connection() as node:
        assert {command(node, "CLUSTER", "KEYSLOT", key) for key in keys} == {slot}
        assert node.exists(*keys) == len(keys)
    for other in redis_cluster.running_nodes:  # no replicas here: no other node holds them
        if other is not owner:
            with other.connection() as node:
                assert command(node, "CLUSTER", "COUNTKEYSINSLOT", slot) == 0


def test_a_multi_key_script_on_one_hash_tag_runs_on_the_cluster(
        redis_cluster: RedisClusterHarness) -> None:
    client = redis_cluster.client()
    source, target = "{p:12}queued", "{p:12}running"
    client.set(source, 3)
    client.delete(target)
    move = client.register_script(MOVE_ONE)
    assert move(keys=[source, target], args=[3]) == 1
    assert move(keys=[source, target], args=[3]) == -1  # the compare failed: nothing moved
    assert client.mget(source, target) == ["2", "1"]


def test_a_script_over_two_slots_is_refused_by_the_server_as_crossslot(
        redis_cluster: RedisClusterHarness) -> None:
    first, second = "{p:1}state", "{p:2}state"
    assert key_slot(first.encode()) != key_slot(second.encode())
    node = redis_cluster.node_for_key(first)
    with node.connection() as plain, pytest.raises(ClusterCrossSlotError):
        plain.eval(MOVE_ONE, 2, first, second, 0)  # the server's CROSSSLOT error


def test_a_node_answers_moved_for_a_key_it_does_not_serve(
        redis_cluster: RedisClusterHarness) -> None:
    key = "{p:3}state"
    owner = redis_cluster.node_for_key(key)
    other = next(n for n in redis_cluster.masters_now() if n is not owner)
    with other.connection() as plain, pytest.raises(MovedError):
        plain.get(key)  # the server's MOVED redirection


def test_a_restarted_master_serves_its_slots_again_to_a_client_connected_before(
        own_cluster: RedisClusterHarness) -> None:
    client = own_cluster.client()
    keys = [f"{{p:{n}}}state" for n in range(60)]
    for key in keys:
        client.set(key, key)
    victim = own_cluster.node_for_key(keys[0])
    pid = victim.pid
    on_victim = [k for k in keys if own_cluster.node_for_key(k) is victim]
    elsewhere = [k for k in keys if k not in on_victim]
    assert on_victim and elsewhere

    own_cluster.restart_node(victim)

    assert victim.pid != pid
    # No persistence: what the restarted node held is gone, which shows it really restarted;
    # the other masters' keys are untouched, and the old client writes to its slots again.
    assert [client.get(k) for k in elsewhere] == elsewhere
    assert [client.get(k) for k in on_victim] == [None] * len(on_victim)
    client.set(keys[0], "again")
    assert client.get(keys[0]) == "again"


@pytest.mark.slow
def test_a_killed_master_fails_over_to_its_replica_and_rejoins_as_its_replica(
        failover_cluster: RedisClusterHarness) -> None:
    cluster = failover_cluster
    client = cluster.client()
    key = "{p:5}state"
    client.set(key, "kept")
    master = cluster.node_for_key(key)
    (replica,) = cluster.replicas_of(master)
    with master.connection() as plain:
        assert command(plain, "WAIT", 1, 10_000) == 1  # the replica has the write

    cluster.kill_node(master)
    cluster.wait_ok()  # waits out node-timeout and the election

    assert cluster.node_for_key(key) is replica
    assert client.get(key) == "kept"
    cluster.start_node(master)
    assert cluster.replicas_of(replica) == [master]
    assert client.get(key) == "kept"


def test_closing_the_harness_leaves_no_redis_process_behind(tmp_path: Path) -> None:
    require_binaries()
    harness = RedisClusterHarness(tmp_path / "cluster")
    try:
        harness.start()
        pids = [n.pid for n in harness.nodes]
        assert all(pid is not None for pid in pids)
    finally:
        harness.close()
    assert all(_process_gone(pid) for pid in pids if pid is not None)
    assert not harness.running_nodes
    harness.close()  # idempotent
