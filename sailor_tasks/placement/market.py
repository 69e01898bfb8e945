"""Market choice for ``market=auto`` (Harvest-VM / Can't-Be-Late style), decided per offer.

Harvest VMs (SOSP'21): short work fits between evictions, long work belongs on stable capacity.
Can't Be Late (NSDI'24): spot is safe while the deadline's slack covers the time preemptions may
cost; once slack runs low, on-demand. SAILOR decides once, at placement, per offer:

* no deadline → spot (slack is unbounded), unless spot is not cheaper once its expected preemption
  loss is added, or its catalog price is dirty (spot above on-demand);
* with a deadline → slack = deadline − expected hours − data transfer hours; spot when
  slack ≥ ``SLACK_SAFETY`` × expected preemption overhead + one restart (slack-rich), or when the
  job is short (≤ ``SHORT_JOB_HOURS``) and the slack covers the expected overhead; otherwise
  on-demand (long jobs with little slack).
"""

from __future__ import annotations

import numpy as np

from sailor_tasks.placement.context import RESTART_HOURS, RequestContext

SHORT_JOB_HOURS = 1.0
"""Jobs at most this long run on spot whenever the slack covers their expected overhead."""
SLACK_SAFETY = 2.0
"""Slack must cover this many times the expected preemption overhead (variance margin)."""


def spot_preferred(ctx: RequestContext) -> np.ndarray:
    """Per offer (length M = candidates / 2): True when market=auto picks spot for it."""
    idx = ctx.index
    m = len(idx.offers)
    hours = ctx.hours[:m]
    overhead = ctx.overhead_hours[:m]
    spot_price, od_price = idx.c_price[:m], idx.c_price[m:]
    ok = ~idx.c_dirty[:m]
    # Spot must stay cheaper once the work it loses is paid for again.
    ok &= spot_price * (hours + overhead) < od_price * hours
    deadline = ctx.request.deadline_hours
    if deadline is not None:
        slack = deadline - hours - ctx.data_hours[:m]
        slack_rich = slack >= SLACK_SAFETY * overhead + RESTART_HOURS
        short = (hours <= SHORT_JOB_HOURS) & (slack >= overhead)
        ok &= slack_rich | short
    return ok


def describe_choice(ctx: RequestContext, row: int) -> str:
    """One line saying why auto picked the market of candidate ``row``."""
    idx = ctx.index
    m = len(idx.offers)
    o = row % m
    market = "spot" if row < m else "on_demand"
    hours, overhead = ctx.hours[o], ctx.overhead_hours[o]
    prem = ctx.expected_preemptions[o]
    deadline = ctx.request.deadline_hours
    parts = [f"expected {hours:.3g} h on this offer, {prem:.3g} spot preemptions costing {overhead:.3g} h"]
    if idx.c_dirty[o]:
        parts.append("spot price above on-demand in the catalog")
    if deadline is None:
        parts.append("no deadline (slack unbounded)")
    else:
        slack = deadline - hours - ctx.data_hours[o]
        parts.append(f"deadline {deadline:g} h leaves {slack:.3g} h slack")
    why = "short or slack-rich job" if market == "spot" else "long job with little slack or spot not cheaper"
    return f"market auto → {market} ({why}): " + "; ".join(parts)
