"""/healthz and /metrics answer while the default thread pool is taken (a long-poll reconnect
storm queues thousands of store reads there): they run on threads of their own."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import anyio
import anyio.to_thread
from sessionfold.service import ops


class _Store:
    def check_schema(self) -> str:
        return "0007"


class _Redis:
    def ping(self) -> bool:
        return True


def test_health_and_metrics_answer_while_the_default_pool_is_busy() -> None:
    state: Any = SimpleNamespace(store=_Store(), redis=lambda: _Redis(),
                                 watcher=SimpleNamespace(mode="poll"))

    async def main() -> tuple[int, int]:
        pool = anyio.to_thread.current_default_thread_limiter()
        pool.total_tokens = 1
        await pool.acquire()  # every default thread is busy (here: its one token is held)
        try:
            with anyio.fail_after(10):  # on the default pool this would wait for ever
                health = await ops.healthz(state)
                metrics = await ops.metrics()
        finally:
            pool.release()
        return health.status_code, metrics.status_code

    assert anyio.run(main) == (200, 200)
    assert ops.ops_limiter().total_tokens == 2
