"""Datasets: URIs, checksummed copies between buckets (placement and replication), the demo corpus."""
