"""Gavel-style heterogeneity-aware policies (LPs over X, solved with HiGHS) and the round mechanism."""

from sailor_tasks.policies import efficiency, fairness  # noqa: F401  (register the policies)
from sailor_tasks.policies.base import (
    Allocation,
    JobToGpuShare,
    Policy,
    PolicyJob,
    PolicyState,
    get_policy,
    policy_names,
    register,
    space_sharing_policies,
)

__all__ = [
    "Allocation",
    "JobToGpuShare",
    "Policy",
    "PolicyJob",
    "PolicyState",
    "get_policy",
    "policy_names",
    "register",
    "space_sharing_policies",
]
