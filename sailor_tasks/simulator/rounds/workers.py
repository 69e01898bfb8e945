"""Region shards in worker processes: the simulator's round loop on several cores.

The loop (``engine.simulate``) drives every shard in lock step: as soon as a round's length is
known it submits ``progress`` and ``prepare`` (the next round's grants, computed ahead) to every
shard, then offers free GPUs elsewhere to waiting and running jobs and routes the next arrivals
meanwhile, then submits ``plan`` and collects every answer with ``result``. Workers thus run their
part of the round while this process routes. The first shard runs in the calling
process, while the others run in worker processes started with ``spawn`` (no state is inherited:
HiGHS and thread pools start clean in each). Results do not depend on the split: each region is
simulated by the same code in the same order, and the loop merges the answers in region order.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from sailor_tasks.simulator.rounds.shard import RegionShard

if TYPE_CHECKING:
    from sailor_tasks.catalog.throughput import ThroughputTable
    from sailor_tasks.simulator.rounds.config import SimConfig
    from sailor_tasks.simulator.rounds.hooks import Region
    from sailor_tasks.simulator.rounds.workload import SimJob

_STOP = "stop"


CALLER_SHARE = 2 / 3
"""Regions the calling process takes, relative to a worker's: it also routes, while the workers
run the round ahead (``prepare``). On the 100,000-job bench (10 regions, 2 processes), 4 regions
here and 6 in the worker beat 5/5 and 3/7."""


def split_regions(n_regions: int, processes: int) -> list[list[int]]:
    """Region indices per shard, the calling process's first (``CALLER_SHARE``); never an empty
    shard."""
    processes = max(1, min(processes, n_regions))
    if processes == 1:
        return [list(range(n_regions))]
    workers = processes - 1
    own = min(n_regions - workers, max(1, round(n_regions * CALLER_SHARE / (CALLER_SHARE + workers))))
    rest = list(range(own, n_regions))
    return [list(range(own))] + [rest[k::workers] for k in range(workers)]


Call = tuple[str, tuple]
"""(``RegionShard`` method, its arguments)."""


class LocalShard:
    """A shard in this process: ``result`` runs the calls submitted since the last ``result``,
    except ``prepare``: here it would run right before the next ``plan``, gaining nothing over
    granting in ``plan`` and wasted in every region the loop's events change (its answer is None,
    as a worker's)."""

    def __init__(self, shard: RegionShard):
        self.shard = shard
        self.regions = list(shard.sims)
        self._calls: list[Call] = []

    def submit(self, calls: Sequence[Call]) -> None:
        self._calls += calls

    def result(self) -> list[Any]:
        calls, self._calls = self._calls, []
        return [None if method == "prepare" else getattr(self.shard, method)(*args) for method, args in calls]

    def close(self) -> None:
        pass


def _serve(conn, payload: tuple) -> None:
    """Worker process: build the shard, then answer batches of calls until told to stop."""
    try:
        shard: RegionShard | None = RegionShard(*payload)
        failure: BaseException | None = None
    except BaseException as exc:  # reported on the first call
        shard, failure = None, exc
    while True:
        try:
            calls = conn.recv()  # blocks: a waiting process takes no CPU from the one it waits for
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

    def __init__(self, payload: tuple):
        self.regions = list(payload[2])
        self._sent = 0
        """Batches sent whose answers ``result`` has not read yet."""
        ctx = multiprocessing.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(target=_serve, args=(child, payload), daemon=True)
        self.process.start()
        child.close()

    def submit(self, calls: Sequence[Call]) -> None:
        """Send a batch; the worker starts on it at once."""
        self.conn.send(list(calls))
        self._sent += 1

    def result(self) -> list[Any]:
        """The answers to every batch sent since the last ``result``, in order."""
        out: list[Any] = []
        while self._sent:
            self._sent -= 1
            try:
                status, value = self.conn.recv()
            except EOFError:
                raise RuntimeError(
                    f"simulator worker process exited (exit code {self.process.exitcode})"
                ) from None
            if status == "error":
                self._drain()
                raise value
            out += value
        return out

    def _drain(self) -> None:
        """Read (and drop) the answers still owed, so the pipe stays in step after an error."""
        while self._sent:
            self._sent -= 1
            try:
                self.conn.recv()
            except EOFError:
                break

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


def start_shards(
    jobs: Sequence[SimJob], regions: Sequence[Region], table: ThroughputTable, config: SimConfig
) -> list[LocalShard | RemoteShard]:
    """The shards for ``config.workers`` processes, this process's first (close them when done)."""
    groups = split_regions(len(regions), config.workers)
    # Workers first: they start (import, build) while this process builds its own shard.
    remote = [RemoteShard((jobs, regions, own, table, config)) for own in groups[1:]]
    try:
        local = LocalShard(RegionShard(jobs, regions, groups[0], table, config))
    except BaseException:
        for shard in remote:
            shard.close()
        raise
    return [local, *remote]
