"""The ledger's schema revisions, oldest first by their ``down_revision`` chain."""
