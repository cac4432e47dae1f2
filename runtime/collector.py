"""The garbage collector of a long-lived sessionfold process, settled once start-up is done.

Shared by worker children, the scheduler and the API: see :func:`freeze_startup_objects`.
"""

from __future__ import annotations

import gc

__all__ = ["YOUNG_GC_THRESHOLD", "freeze_startup_objects"]


#: Allocations between two collections of the youngest generation in sessionfold's processes.
YOUNG_GC_THRESHOLD = 10_000


def freeze_startup_objects() -> None:
    """Move every object alive now into the collector's permanent generation.

    Called once start-up is done (a worker's main process before its pool forks, each pool
    child after the fork, the scheduler before its loop): the objects made by imports and
    set-up live as long as the process, and a full collection that walks them costs ~0.5 µs
    each (tens of ms with Celery loaded) for nothing. Collect first so that start-up garbage is
    not frozen with them. Frozen in the worker's main process, the heap a child inherits is not
    walked by the child's own collections either: a walk writes to every object it visits, so
    each child kept a private copy of the parent's heap (bench/RESULTS.md, "Pool children").

    The youngest generation's threshold is raised from Python's 700 allocations to
    :data:`YOUNG_GC_THRESHOLD`: a fold of a 300-item window makes ~20,000 objects that live as
    long as the fold, and at 700 the collector walked them again about seven times a fold
    (10 ms of a 60 ms fold in ``bench/profile_fold.py``'s window; 3 ms at 10,000). Reference
    cycles still go at the next collection, ten thousand allocations on at most.
    """
    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_GC_THRESHOLD, older, oldest)
