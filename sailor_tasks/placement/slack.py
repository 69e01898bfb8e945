"""Market choice for ``market=auto`` (Harvest-VM / Can't-Be-Late style), decided per offer.

Harvest VMs (SOSP'21): short work fits between evictions, long work belongs on stable capacity.
Can't Be Late (NSDI'24): spot is safe while the deadline's slack covers the time preemptions may
cost; once slack runs low, on-demand. SAILOR decides once, at placement, per offer:

* no deadline → spot (slack is unbounded), unless spot is not cheaper once its expected preemption
  loss is added, or its catalog price is dirty (spot above on-demand);
* with a deadline → slack = deadline − one launch − expected hours − data transfer hours (what the
  deadline rule counts besides the preemption overhead); spot when
  slack ≥ ``SLACK_SAFETY`` × expected preemption overhead + one restart (slack-rich), or when the
  job is short (≤ ``SHORT_JOB_HOURS``) and the slack covers the expected overhead; otherwise
  on-demand (long jobs with little slack).
"""

from __future__ import annotations

import numpy as np

from sailor_tasks.placement.context import RESTART_HOURS, RequestContext
from sailor_tasks.placement.index import MARKET_NAMES

SHORT_JOB_HOURS = 1.0
"""Jobs at most this long run on spot whenever the slack covers their expected overhead."""
SLACK_SAFETY = 2.0
"""Slack must cover this many times the expected preemption overhead (variance margin)."""


def slack_allows_spot(slack_h, hours, overhead_h):
    """The Can't-Be-Late slack test: spot is safe when the slack covers its expected preemption loss.

    Shared by market=auto at placement (numpy arrays, one entry per offer) and the ``sailor``
    strategy's decisions during a run (floats).

    Args:
        slack_h: hours to spare before the deadline once the work and transfers are done.
        hours: hours of work left.
        overhead_h: expected hours spot preemptions cost over that work.
    """
    slack_rich = slack_h >= SLACK_SAFETY * overhead_h + RESTART_HOURS
    short = (hours <= SHORT_JOB_HOURS) & (slack_h >= overhead_h)
    return slack_rich | short


def spot_preferred(ctx: RequestContext) -> np.ndarray:
    """Per candidate row: True when market=auto picks spot for the row's offer."""
    c = ctx.c
    hours = ctx.hours
    overhead = ctx.spot_overhead_hours
    ok = ~c.spot_dirty
    # Spot must stay cheaper once the work it loses is paid for again.
    with np.errstate(invalid="ignore"):
        ok &= c.spot_price * (hours + overhead) < c.od_price * hours
    deadline = ctx.request.deadline_hours
    if deadline is not None:
        # The launch counts as the deadline validator counts it: without it, a short job whose slack
        # covers its overhead but not overhead + launch goes to spot, misses the deadline there,
        # and its on-demand row (which would meet it) has been rejected by this rule.
        ok &= slack_allows_spot(deadline - RESTART_HOURS - hours - ctx.data_hours, hours, overhead)
    return ok


def describe_choice(ctx: RequestContext, row: int) -> str:
    """One line saying why auto picked the market of candidate ``row`` (a position in ``ctx.rows``)."""
    c = ctx.c
    market = MARKET_NAMES[c.market[row]]
    hours, overhead = ctx.hours[row], ctx.spot_overhead_hours[row]
    prem = ctx.expected_preemptions[row]
    deadline = ctx.request.deadline_hours
    parts = [f"expected {hours:.3g} h on this offer, {prem:.3g} spot preemptions costing {overhead:.3g} h"]
    if c.spot_dirty[row]:
        parts.append("spot price above on-demand in the catalog")
    if deadline is None:
        parts.append("no deadline (slack unbounded)")
    else:
        slack = deadline - RESTART_HOURS - hours - ctx.data_hours[row]
        parts.append(f"deadline {deadline:g} h leaves {slack:.3g} h slack")
    why = "short or slack-rich job" if market == "spot" else "long job with little slack or spot not cheaper"
    return f"market auto → {market} ({why}): " + "; ".join(parts)
