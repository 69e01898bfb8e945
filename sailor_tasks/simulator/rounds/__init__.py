"""The round-based simulator (Gavel-style): the product's policies, mechanism, placement engine and
recovery strategies driven over a job trace, regions simulated in shards (optionally in processes)."""
