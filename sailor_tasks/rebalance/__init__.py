"""Slow path: from recorded utilization to a versioned region assignment (team → region shares)."""
