"""GKE recovery and pods, offline: node pools across recoveries, the preemption window, the pods.

Runs the GKE backend against an in-memory ClusterManager (``sailor_tasks/testing/gke_fake.py``;
node-pool bodies are ``container_v1`` objects) with its records on a local GCS API server. Each of
``--runs`` runs is provisioned on ``--recoveries + 1`` placements drawn from the catalog (random
region, zone, machine, GPU and market, as recoveries would move it), each provision retried once
(a retried task), then torn down. Prints one JSON object last:

- pools_mismatched: attempts whose pool is not of their placement (zone, machine type, GPU, market);
- pools_created / pools_expected: pools made vs distinct placements (a retry makes none);
- leaked_pools: pools left after every run's teardown;
- gke_grace_s: seconds training pods get to save on a Spot preemption as SAILOR configures pools
  (``gke.configured_grace_s``), against gke_default_grace_s (GKE's default pool);
- gke_pod_image_matches: ``sailor render`` of a run with its own image, command and env gives pods
  running that image and command with that env and the run contract's variables;
- seconds: wall time of the whole benchmark.

Run: .venv/bin/python bench/gke_recovery.py [--runs 20] [--recoveries 4] [--seed 0]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import random
import time


def random_placement(rng: random.Random, offers: list, run_id: str):
    from sailor_tasks.model import Placement

    while True:
        offer = rng.choice(offers)
        market = rng.choice(("spot", "on_demand"))
        price = offer.usd_per_hour(market)
        if price is None:
            continue
        nodes = rng.randint(1, 3)
        return Placement(
            run_id=run_id,
            cloud="gcp",
            region=offer.region,
            zone=offer.zone,
            gpu_type=offer.gpu_type,
            gpus_per_node=offer.gpus_per_node,
            num_nodes=nodes,
            num_gpus=offer.gpus_per_node * nodes,
            market=market,
            instance_type=offer.instance_type,
            usd_per_hour=price * nodes,
        )


def pool_matches(pool, placement) -> bool:
    from sailor_tasks.backends.gke import accelerator_type

    (acc,) = pool.config.accelerators
    return (
        list(pool.locations) == [placement.zone]
        and pool.config.machine_type == placement.instance_type
        and acc.accelerator_type == accelerator_type(placement.gpu_type)
        and acc.accelerator_count == placement.gpus_per_node
        and pool.config.spot is (placement.market == "spot")
    )


def render_matches(settings) -> bool:
    from sailor_tasks.airflow_glue.gcp import render_run
    from sailor_tasks.runtime import contract

    image = "europe-docker.pkg.dev/acme/ml/train:1.2"
    command = ["python", "/app/train.py", "--lr", "0.1"]
    params = {
        "num_workers": 16,
        "gpu_type": "H100",
        "market": "spot",
        "max_usd_per_hour": 200,
        "image": image,
        "command": command,
        "env": {"MY_FLAG": "on"},
    }
    out = render_run(params, settings)
    pods = [m for m in out["manifests"] if m["kind"] == "Pod"]
    ok = bool(pods)
    for pod in pods:
        (container,) = pod["spec"]["containers"]
        env = {e["name"]: e["value"] for e in container["env"]}
        ok &= container["image"] == image and container["command"][-len(command) :] == command
        ok &= env.get("MY_FLAG") == "on" and all(
            n in env for n in (contract.RUN_ID, contract.DATA_DIR, contract.CHECKPOINT_DIR, contract.NOTICE_FILE)
        )
        ok &= pod["spec"]["terminationGracePeriodSeconds"] == out["grace_s"]
    return ok


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--recoveries", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    started = time.perf_counter()

    from sailor_tasks.backends import gke
    from sailor_tasks.catalog import load_catalog
    from sailor_tasks.settings import Settings
    from sailor_tasks.storage import filesystem
    from sailor_tasks.testing.gcs_emulator import gcs_emulator
    from sailor_tasks.testing.gke_fake import InMemoryClusterManager

    rng = random.Random(args.seed)
    offers = [o for o in load_catalog().offers if o.gpu_type in gke.ACCELERATOR_TYPES]
    with gcs_emulator() as url:
        os.environ["STORAGE_EMULATOR_HOST"] = url
        os.environ["GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT"] = "false"
        prefix = f"bench-{rng.randrange(16**8):08x}"
        fs, _ = filesystem("gs://x")
        fs.mkdir(f"{prefix}-source")
        settings = dataclasses.replace(Settings.from_env(), bucket_template=f"gs://{prefix}-{{bucket}}")
        fake = InMemoryClusterManager()
        config = gke.GkeConfig(project="bench")
        backend = gke.GkeBackend(settings, config=config, client=fake, poll_s=0)
        mismatched = expected = created = 0
        for r in range(args.runs):
            key = f"bench-run-{r}"
            placements = [random_placement(rng, offers, key) for _ in range(args.recoveries + 1)]
            expected += len({json.dumps(gke.pool_spec(p), sort_keys=True) for p in placements})
            for pl in placements:
                for _ in range(2):  # the attempt, then a retried task on the same placement
                    record = backend.provision(key, pl)
                    mismatched += not pool_matches(fake.pools[record["node_pool_path"]], pl)
                    created += record["node_pool_state"] == "created"
        for r in range(args.runs):
            backend.teardown(f"bench-run-{r}")
        leaked = len(fake.pools)
        image_ok = render_matches(settings)
    print(
        json.dumps(
            {
                "runs": args.runs,
                "attempts_per_run": args.recoveries + 1,
                "pools_mismatched": mismatched,
                "pools_created": created,
                "pools_expected": expected,
                "leaked_pools": leaked,
                "gke_grace_s": gke.configured_grace_s(config),
                "gke_default_grace_s": config.pod_grace_s(extended=False),
                "gke_pod_image_matches": image_ok,
                "seconds": round(time.perf_counter() - started, 2),
            }
        )
    )


if __name__ == "__main__":
    main()
