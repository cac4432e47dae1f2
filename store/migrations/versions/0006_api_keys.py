"""api_keys: the HTTP API's bearer keys (``sessionfold keys create TENANT``).

One row per key: its public id, the tenant it acts for, whether it may use the operator routes,
the SHA-256 digest of its secret (the secret itself is never stored) and when it was revoked. A
tenant has no table of its own: it exists once it has a key, and its sessions are the store's
sessions whose id starts with ``tenant:<name>/`` (see ``sessionfold.service.tenancy``), so no
existing row changes here.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

UTCDateTime = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "api_keys",
        sa.Column("key_id", sa.String(32), primary_key=True),
        sa.Column("tenant", sa.String(64), nullable=False),
        sa.Column("admin", sa.Boolean, nullable=False),
        sa.Column("digest", sa.String(64), nullable=False),
        sa.Column("created_at", UTCDateTime, nullable=False),
        sa.Column("revoked_at", UTCDateTime, nullable=True),
    )
    op.create_index("ix_api_keys_tenant", "api_keys", ["tenant"])


def downgrade() -> None:
    op.drop_index("ix_api_keys_tenant", table_name="api_keys")
    op.drop_table("api_keys")
