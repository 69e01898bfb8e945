"""held GPUs per zone and GPU type

Revision ID: 5c2d9e7a41b3
Revises: e4ecccf96fbc
Create Date: 2026-11-30 02:50:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '5c2d9e7a41b3'
down_revision = 'e4ecccf96fbc'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('held',
    sa.Column('zone', sa.String(length=50), nullable=False),
    sa.Column('gpu_type', sa.String(length=30), nullable=False),
    sa.Column('gpus', sa.Integer(), nullable=False),
    sa.PrimaryKeyConstraint('zone', 'gpu_type'),
    if_not_exists=True,  # a ledger made by create_all from the models already has it
    )
    # The sums of the reservations live now (a table create_all made is rebuilt from them too).
    op.execute('DELETE FROM held')
    op.execute(
        'INSERT INTO held (zone, gpu_type, gpus) '
        'SELECT zone, gpu_type, SUM(gpus) FROM reservations '
        'WHERE released_at IS NULL GROUP BY zone, gpu_type'
    )


def downgrade() -> None:
    op.drop_table('held')
