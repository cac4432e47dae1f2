"""The garbage collector as sessionfold's long-running processes set it once start-up is done
(``runtime.collector.freeze_startup_objects``): the start-up heap frozen, so a full collection
does not walk it (it paused full-decode window reads for ~90 ms), and the young generation's
threshold raised, so a fold's live objects are not walked again every 700 allocations.

Each check runs in a fresh interpreter: freezing is process-wide and would change the test
process's own collector."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def _run(code: str) -> str:
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_start_up_objects_are_frozen_and_the_young_threshold_raised() -> None:
    out = _run("""
        import gc
        import sessionfold.runtime.wiring  # what a process imports at start-up
        from sessionfold.runtime.collector import YOUNG_GC_THRESHOLD, freeze_startup_objects
        before = gc.get_threshold()
        freeze_startup_objects()
        after = gc.get_threshold()
        assert gc.get_freeze_count() > 10_000, gc.get_freeze_count()
        assert after == (YOUNG_GC_THRESHOLD, before[1], before[2]), (before, after)
        assert YOUNG_GC_THRESHOLD > before[0]
        print("ok")
    """)
    assert out == "ok"


def test_garbage_cycles_made_after_start_up_are_still_collected() -> None:
    out = _run("""
        import gc, weakref
        from sessionfold.runtime.collector import freeze_startup_objects
        freeze_startup_objects()

        class Node:
            pass

        a, b = Node(), Node()
        a.other, b.other = b, a
        gone = weakref.ref(a)
        del a, b
        # Past the raised threshold of live allocations: the collector runs by itself.
        keep = [[] for _ in range(30_000)]
        print("collected" if gone() is None else "alive")
    """)
    assert out == "collected"


def test_the_scheduler_command_and_the_api_settle_the_collector() -> None:
    # The call sites, read from the source: a worker child (WorkerRuntime.after_fork), the
    # scheduler command before its loop, the API's lifespan once connected.
    import inspect

    from sessionfold.cli.commands import pipeline
    from sessionfold.service import app
    from sessionfold.workers.runtime import WorkerRuntime

    for source in (inspect.getsource(WorkerRuntime.after_fork),
                   inspect.getsource(pipeline._scheduler), inspect.getsource(app.create_app)):
        assert "freeze_startup_objects()" in source
