"""Alembic revisions of the session store schema, oldest first."""
