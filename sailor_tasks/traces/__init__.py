"""Spot availability and preemption traces: one parser module per source format.

- ``availability``: the JSON availability trace format ``{"metadata": {"gap_seconds": N}, "data": [...]}``.
- ``gcp_2020``: the GCP preemptible-GPU logs of Feb–Mar 2020 (per-zone preemption events and rates).

Parsers are pure (text/dicts in, frozen dataclasses out) plus a thin loader over ``storage``, so the
local backend's preemption injection, the simulator and spot economics share them.
"""
