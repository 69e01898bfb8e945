"""Alembic environment of the ledger: ``env.py``, the revision template and ``versions/`` (one file per
schema revision). Driven by ``sailor_tasks.ledger.migrate`` and ``sailor db``; see
docs/ledger.md, "Changing the ledger schema"."""
