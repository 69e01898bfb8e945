"""The GPUs held per (zone, GPU type) that the reserving and releasing transactions keep: always
the sums of the live reservations, whatever changed them, on SQLite and under concurrent
replacements on PostgreSQL; an upgrade starts them from the reservations live before it."""

from __future__ import annotations

import random
import threading
from collections import Counter

from sqlalchemy import create_engine, insert

from sailor_tasks.ledger import Ledger, migrate
from sailor_tasks.ledger import schema as t
from sailor_tasks.ledger.store import utcnow
from sailor_tasks.model import Reservation

ZONES = ("us-east1-b", "us-east1-c", "europe-west4-a")
GPUS = ("V100", "A100")


def _summed(ledger: Ledger, exclude: str | None = None) -> dict[tuple[str, str], int]:
    """What the held sums must be: every live reservation's GPUs, added up here."""
    out: Counter = Counter()
    for r in ledger.live_reservations():
        if r.run_id != exclude:
            out[(r.zone, r.gpu_type)] += r.gpus
    return {k: n for k, n in out.items() if n}


def _random_reservation(rng: random.Random, run_id: str) -> Reservation:
    zone = rng.choice(ZONES)
    return Reservation(run_id, zone.rsplit("-", 1)[0], zone, rng.choice(GPUS), rng.randint(1, 8), "spot")


def test_the_held_sums_equal_the_live_reservations_after_every_kind_of_change(tmp_path):
    ledger = Ledger(f"sqlite:///{tmp_path}/ledger.db")
    rng = random.Random(7)
    runs = [f"run-{i}" for i in range(12)]
    for run_id in runs:
        ledger.upsert_run(
            run_id,
            job_name="j",
            team="ml",
            status="validated",
            backend="local",
            model="tiny_gpt",
            dataset_uri="sailor://source/d",
            request={},
        )
    done = Counter()
    for _ in range(400):
        run_id = rng.choice(runs)
        op = rng.choice(["reserve", "reserve_if_free", "release", "reclaim", "mark_planned_ended"])
        if op == "reserve":  # a new reservation, or the run's replaced (live or released before)
            ledger.reserve(_random_reservation(rng, run_id))
        elif op == "reserve_if_free":
            ledger.reserve_if_free(_random_reservation(rng, run_id), rng.randint(4, 20))
        elif op == "release":
            ledger.release(run_id)
        elif op == "reclaim":  # an expired lease, claimed, then reclaimed
            ledger.reserve(_random_reservation(rng, run_id), lease_s=-1)
            ledger.claim_expired(run_id)
            ledger.reclaim(run_id)
        else:  # a run that ended keeps its status; the reservation it still holds is released
            ledger.reserve(_random_reservation(rng, run_id))
            ledger.upsert_run(run_id, status="failed")
            assert not ledger.mark_planned(run_id)
            ledger.upsert_run(run_id, status="validated")
        done[op] += 1
        assert ledger.held_gpus() == _summed(ledger), op
        other = rng.choice(runs)
        assert ledger.held_gpus(exclude_run_id=other) == _summed(ledger, other), op
    assert min(done.values()) > 40  # every kind of change was made, many times
    assert ledger.live_reservations()  # and the sums were checked with reservations live
    ledger.dispose()


def test_an_upgrade_sums_the_reservations_live_before_it(tmp_path):
    url = f"sqlite:///{tmp_path}/ledger.db"
    engine = create_engine(url)
    migrate.upgrade(engine, migrate.revisions()[migrate.revisions().index("5c2d9e7a41b3") - 1])
    now = utcnow()
    rows = [
        ("a", "us-east1-b", "V100", 2, None),
        ("b", "us-east1-b", "V100", 3, None),
        ("c", "us-east1-c", "A100", 4, None),
        ("gone", "us-east1-c", "A100", 8, now),
    ]
    with engine.begin() as c:
        for run_id, zone, gpu, gpus, released in rows:
            c.execute(
                insert(t.reservations).values(
                    run_id=run_id,
                    region="us-east1",
                    zone=zone,
                    gpu_type=gpu,
                    gpus=gpus,
                    market="spot",
                    created_at=now,
                    released_at=released,
                )
            )
    engine.dispose()
    ledger = Ledger(url)
    assert ledger.held_gpus() == {("us-east1-b", "V100"): 5, ("us-east1-c", "A100"): 4}
    ledger.reserve(Reservation("d", "us-east1", "us-east1-c", "A100", 1, "spot"))
    ledger.release("a")
    assert ledger.held_gpus() == {("us-east1-b", "V100"): 3, ("us-east1-c", "A100"): 5}
    ledger.dispose()


def test_postgresql_runs_moving_between_zones_at_once_keep_the_sums_and_never_deadlock(postgres):
    """Runs replaced back and forth between two zones by several processes at once, in opposite
    directions: the sums' rows are updated in one order in every transaction, so none deadlocks,
    and the sums end equal to the live reservations."""
    url = postgres.create_database("held_moves")
    ledgers = [Ledger(url) for _ in range(4)]
    for k in range(3):  # reserved before: the processes replace these runs' reservations at once
        ledgers[0].reserve(Reservation(f"run-shared-{k}", "us-east1", "us-east1-b", "A100", 1, "spot"))
    errors: list[BaseException] = []
    start = threading.Barrier(len(ledgers))

    def move(i: int, ledger: Ledger) -> None:
        zones = ("us-east1-b", "us-east1-c") if i % 2 else ("us-east1-c", "us-east1-b")
        start.wait()
        try:
            for k in range(60):
                zone = zones[k % 2]
                ledger.reserve(Reservation(f"run-{i}", "us-east1", zone, "A100", i + 1, "spot"))
                ledger.reserve(Reservation(f"run-shared-{k % 3}", "us-east1", zone, "A100", 1, "spot"))
                if k % 7 == 0:
                    ledger.release(f"run-{i}")
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=move, args=(i, led)) for i, led in enumerate(ledgers)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert errors == []
    assert ledgers[0].held_gpus() == _summed(ledgers[0])
    assert sum(ledgers[0].held_gpus().values()) == sum(i + 1 for i in range(4)) + 3
    for led in ledgers:
        led.dispose()
