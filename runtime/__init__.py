"""sessionfold.runtime: what agents, app servers, the API and the workers share.

Settings, wiring (store, Redis, summarizer), Redis keys and connection, metrics, the usage bus's
events and publisher, the fold procedure and the summarizer's guards and providers. Nothing
here imports Celery: the Celery side is :mod:`sessionfold.workers`.
"""
