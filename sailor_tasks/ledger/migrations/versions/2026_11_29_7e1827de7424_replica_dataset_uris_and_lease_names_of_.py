"""replica dataset URIs and lease names of any length

Revision ID: 7e1827de7424
Revises: 0054549a8cee
Create Date: 2026-11-29 10:14:40.307232
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '7e1827de7424'
down_revision = '0054549a8cee'
branch_labels = None
depends_on = None


def upgrade() -> None:
    # A request's dataset_uri may be 1,024 characters, and a copy's lease is named after its
    # replica's URI: VARCHAR(500) refused them on PostgreSQL once the copy was done.
    with op.batch_alter_table('leases', schema=None) as batch_op:
        batch_op.alter_column('name',
               existing_type=sa.VARCHAR(length=500),
               type_=sa.Text(),
               existing_nullable=False)

    with op.batch_alter_table('replicas', schema=None) as batch_op:
        batch_op.alter_column('dataset_uri',
               existing_type=sa.VARCHAR(length=500),
               type_=sa.Text(),
               existing_nullable=False)


def downgrade() -> None:
    with op.batch_alter_table('replicas', schema=None) as batch_op:
        batch_op.alter_column('dataset_uri',
               existing_type=sa.Text(),
               type_=sa.VARCHAR(length=500),
               existing_nullable=False)

    with op.batch_alter_table('leases', schema=None) as batch_op:
        batch_op.alter_column('name',
               existing_type=sa.Text(),
               type_=sa.VARCHAR(length=500),
               existing_nullable=False)
