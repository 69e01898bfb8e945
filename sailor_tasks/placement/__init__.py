"""Fast path: place one run (region, zone, GPU type, market) from the catalog and the cluster state."""

from sailor_tasks.placement.planner import Candidate, cheapest_candidate, enumerate_candidates, plan

__all__ = ["Candidate", "cheapest_candidate", "enumerate_candidates", "plan"]
