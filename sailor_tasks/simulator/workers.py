"""Region shards in worker processes: the simulator's round loop on several cores.

The loop (``engine.simulate``) calls every shard in lock step, once a round: ``submit`` sends a
batch of calls (last round's ``progress``, this round's ``plan``) to every shard, then ``result``
collects the answers. The first shard runs in the calling
process, while the others run in worker processes started with ``spawn`` (no state is inherited:
HiGHS and thread pools start clean in each). Results do not depend on the split: each region is
simulated by the same code in the same order, and the loop merges the answers in region order.
"""

from __future__ import annotations

import multiprocessing
import os
import time
from collections.abc import Sequence
from typing import Any

from sailor_tasks.simulator.shard import RegionShard

_STOP = "stop"
SPIN_S = 0.01
"""How long a side waiting for the other polls before it blocks. Rounds take about a millisecond;
a blocked process is woken late (a pipe round trip took 124 µs blocking, 54 µs polling on this
2-core VM). Only when every process has a core of its own: otherwise spinning takes CPU from the
side being waited for."""


def _receive(conn, spin_s: float) -> Any:
    deadline = time.perf_counter() + spin_s
    while not conn.poll() and time.perf_counter() < deadline:
        pass
    return conn.recv()


def split_regions(n_regions: int, processes: int) -> list[list[int]]:
    """Region indices per shard, the calling process's first: an even split (regions are
    interleaved), never an empty shard.

    The calling process's share is not made smaller for its routing: the loop is in lock step,
    so the workers wait while it routes, and only the region work runs in parallel.
    """
    processes = max(1, min(processes, n_regions))
    return [list(range(k, n_regions, processes)) for k in range(processes)]


Call = tuple[str, tuple]
"""(``RegionShard`` method, its arguments)."""


class LocalShard:
    """A shard in this process; ``result`` runs the submitted calls."""

    def __init__(self, shard: RegionShard):
        self.shard = shard
        self.regions = list(shard.sims)
        self._calls: Sequence[Call] = ()

    def submit(self, calls: Sequence[Call]) -> None:
        self._calls = calls

    def result(self) -> list[Any]:
        calls, self._calls = self._calls, ()
        return [getattr(self.shard, method)(*args) for method, args in calls]

    def close(self) -> None:
        pass


def _serve(conn, payload: tuple, spin_s: float) -> None:
    """Worker process: build the shard, then answer batches of calls until told to stop."""
    try:
        shard: RegionShard | None = RegionShard(*payload)
        failure: BaseException | None = None
    except BaseException as exc:  # reported on the first call
        shard, failure = None, exc
    while True:
        try:
            calls = _receive(conn, spin_s)
        except EOFError:  # the caller went away
            return
        if calls == _STOP:
            return
        try:
            if failure is not None:
                raise failure
            conn.send(("ok", [getattr(shard, method)(*args) for method, args in calls]))
        except BaseException as exc:
            try:
                conn.send(("error", exc))
            except Exception:  # the exception itself does not pickle
                conn.send(("error", RuntimeError(f"{type(exc).__name__}: {exc}")))


class RemoteShard:
    """A shard in a worker process, called over a pipe."""

    def __init__(self, payload: tuple, spin_s: float = 0.0):
        self.regions = list(payload[2])
        self.spin_s = spin_s
        ctx = multiprocessing.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(target=_serve, args=(child, payload, spin_s), daemon=True)
        self.process.start()
        child.close()

    def submit(self, calls: Sequence[Call]) -> None:
        self.conn.send(list(calls))

    def result(self) -> list[Any]:
        try:
            status, value = _receive(self.conn, self.spin_s)
        except EOFError:
            raise RuntimeError(
                f"simulator worker process exited (exit code {self.process.exitcode})"
            ) from None
        if status == "error":
            raise value
        return value

    def close(self) -> None:
        try:
            self.conn.send(_STOP)
        except (BrokenPipeError, OSError):
            pass
        self.process.join(timeout=10)
        if self.process.is_alive():
            self.process.terminate()
            self.process.join()
        self.conn.close()


def start_shards(jobs: Sequence, regions: Sequence, table, config) -> list[LocalShard | RemoteShard]:
    """The shards for ``config.workers`` processes, this process's first (close them when done)."""
    groups = split_regions(len(regions), config.workers)
    # Workers first: they start (import, build) while this process builds its own shard.
    spin_s = SPIN_S if len(groups) <= (os.cpu_count() or 1) else 0.0
    remote = [RemoteShard((jobs, regions, own, table, config), spin_s) for own in groups[1:]]
    try:
        local = LocalShard(RegionShard(jobs, regions, groups[0], table, config))
    except BaseException:
        for shard in remote:
            shard.close()
        raise
    return [local, *remote]
