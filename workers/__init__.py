"""sessionfold.workers: the Celery side of the fold runtime (the app, the fold task, the
scheduler and its usage consumer, partitions, locks, the broker transport)."""
