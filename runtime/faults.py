"""Fault points: where a test stops or kills a worker at an exact moment of a fold.

Test hooks, read from the process environment because they must reach worker processes a test
starts (the one environment read in the fold runtime besides :class:`~.settings.Settings`, and
never configuration: unset, every point does nothing)::

    SESSIONFOLD_TEST_PAUSE_AT=after-summary SESSIONFOLD_TEST_PAUSE_MARKER=/tmp/m   # wait there
    SESSIONFOLD_TEST_KILL_AT=after-commit                                         # die there

With ``SESSIONFOLD_TEST_PAUSE_AT`` naming a point and ``SESSIONFOLD_TEST_PAUSE_MARKER`` a file
path, the first process to reach that point creates the file (holding its pid) and then waits
for ever, so a test can SIGKILL a worker at exactly that moment instead of sleeping and hoping.
With ``SESSIONFOLD_TEST_KILL_AT`` naming a point instead, *every* process reaching it kills
itself with SIGKILL (a fold that takes its worker down each time it runs).

Points: ``after-summary`` (:mod:`.fold_procedure`: the summarizer returned, nothing committed
yet) and ``after-commit`` (:mod:`sessionfold.workers.tasks`: committed, the Celery message not
yet acknowledged).
"""

from __future__ import annotations

import logging
import os
import signal
import time

__all__ = ["KILL_AT_ENV", "PAUSE_AT_ENV", "PAUSE_MARKER_ENV", "fault_point"]

log = logging.getLogger(__name__)

PAUSE_AT_ENV = "SESSIONFOLD_TEST_PAUSE_AT"
PAUSE_MARKER_ENV = "SESSIONFOLD_TEST_PAUSE_MARKER"
KILL_AT_ENV = "SESSIONFOLD_TEST_KILL_AT"


def fault_point(name: str) -> None:
    """Test hook: the first process to reach point ``name`` marks it and waits for ever.

    Does nothing unless ``SESSIONFOLD_TEST_PAUSE_AT`` equals ``name`` and
    ``SESSIONFOLD_TEST_PAUSE_MARKER`` names a file that does not exist yet. Creating the marker
    is atomic (``O_EXCL``), so of several processes, and of a redelivery after the kill, only
    the first one stops: the job can then run to its end.

    ``SESSIONFOLD_TEST_KILL_AT`` equal to ``name``: every process reaching it SIGKILLs itself.
    """
    if os.environ.get(KILL_AT_ENV) == name:
        log.warning("fault point %s reached in pid %d: killing it", name, os.getpid())
        os.kill(os.getpid(), signal.SIGKILL)
    if os.environ.get(PAUSE_AT_ENV) != name:
        return
    marker = os.environ.get(PAUSE_MARKER_ENV)
    if not marker:
        return
    try:
        fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        return
    try:
        os.write(fd, f"{os.getpid()}\n".encode())
    finally:
        os.close(fd)
    log.warning("fault point %s reached in pid %d: waiting to be killed", name, os.getpid())
    while True:
        time.sleep(3600)
