"""Alembic migrations of the session store, shipped inside the package (see ``store.migrate``)."""
