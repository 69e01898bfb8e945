"""``SimConfig``: what one simulation runs (policy, round length, routing, recovery, workers)."""

from __future__ import annotations

from dataclasses import dataclass

from sailor_tasks.policies.mechanism import GPUS_PER_SERVER

DEFAULT_RECOVERY = "same_zone_first"
"""The recovery strategy of the registry a preempted job follows unless ``SimConfig.recovery`` says."""

ROUND_S = 360.0
"""Gavel's round length (OSDI'20 §7: 6-minute rounds)."""


@dataclass(frozen=True, slots=True)
class SimConfig:
    policy: str = "las"
    round_s: float = ROUND_S
    seed: int = 0
    space_sharing: bool = False
    gpus_per_server: int = GPUS_PER_SERVER
    reuse_stable_rounds: bool = True
    """Reuse last round's grants when they provably repeat (a speed-up with identical results)."""
    horizon_s: float = 10 * 365 * 86400.0
    """Stop here even if jobs remain (e.g. spot capacity that never comes back); they count as
    not completed and are left out of the JCT statistics."""
    router: str = "placement"
    """``placement`` (the placement engine) or the ``least_loaded`` baseline (``routing.ROUTERS``)."""
    recovery: str = DEFAULT_RECOVERY
    """A strategy of ``sailor_tasks.strategies`` or the ``stay_in_region`` baseline."""
    workers: int = 1
    """Processes that simulate regions in parallel (``workers.py``; at most one per region). Routing
    and recovery stay in the calling process; results are identical for any value."""

    def __post_init__(self) -> None:
        if not 0 < self.round_s < float("inf") or self.gpus_per_server < 1:
            raise ValueError(f"round_s={self.round_s}, gpus_per_server={self.gpus_per_server}: need > 0, ≥ 1")
        if self.workers < 1:
            raise ValueError(f"workers={self.workers}: need ≥ 1 (1 simulates every region in this process)")
        if self.space_sharing:
            from sailor_tasks.policies import space_sharing_policies

            if self.policy not in (valid := space_sharing_policies()):
                raise ValueError(
                    f"space sharing with policy {self.policy!r}: it solves no space-sharing pairs; "
                    f"policies that do: {', '.join(valid)}"
                )
