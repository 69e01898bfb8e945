"""Derive SAILOR's packaged GPU offer table from SkyPilot's public GCP catalog (v8 schema).

The source CSV lists host machine rows and accelerator rows separately: a GPU VM costs its host row
plus its accelerator row in the same zone. We pair them with the host family GCP (and SkyPilot)
uses for each accelerator, drop placeholder/unknown prices, and flag spot prices above on-demand.

Run: ``sailor catalog derive --source ../shared/data/catalog/gcp_vms_2026-05-20.csv``.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable, Iterator

from sailor_tasks.model import Offer

# 700.0 is the source catalog's placeholder for "no price" (40 rows in the 2026-05-20 snapshot).
PLACEHOLDER_PRICE_USD = 700.0

# Host VM for (accelerator, count). A2/A3/A4/G2 machine types bundle their GPUs; N1 GPUs attach to
# an n1-standard host with 8 vCPUs per GPU (SkyPilot's default of 8 vCPUs for a 1-GPU N1 VM).
_N1_ATTACHABLE = ("T4", "P4", "P100", "V100")


def host_instance_type(gpu: str, count: int) -> str | None:
    """Return the GCP machine type that carries ``count`` GPUs of type ``gpu``, or None."""
    if gpu == "A100":
        return "a2-megagpu-16g" if count == 16 else f"a2-highgpu-{count}g"
    if gpu == "A100-80GB":
        return f"a2-ultragpu-{count}g"
    if gpu == "H100":
        return f"a3-highgpu-{count}g"
    if gpu == "H100-MEGA":
        return "a3-megagpu-8g" if count == 8 else None
    if gpu == "H200":
        return "a3-ultragpu-8g" if count == 8 else None
    if gpu == "B200":
        return "a4-highgpu-8g" if count == 8 else None
    if gpu == "L4":
        return {1: "g2-standard-4", 2: "g2-standard-24", 4: "g2-standard-48", 8: "g2-standard-96"}.get(count)
    if gpu in _N1_ATTACHABLE:
        return f"n1-standard-{min(8 * count, 64)}"
    return None


OFFER_COLUMNS = (
    "cloud",
    "region",
    "zone",
    "gpu_type",
    "gpus_per_node",
    "instance_type",
    "ondemand_usd_per_hour",
    "spot_usd_per_hour",
    "spot_above_ondemand",
)


def _price(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    if value <= 0.0 or value == PLACEHOLDER_PRICE_USD:
        return None
    return value


def derive_offers(rows: Iterable[dict[str, str]]) -> Iterator[Offer]:
    """Pair accelerator rows with host rows of the same zone; yield clean offers.

    Host rows with a zero price (A4 in the 2026-05-20 snapshot) mean the provider bundles the host
    into the accelerator price, so the accelerator price alone is used there.
    """
    rows = list(rows)
    hosts: dict[tuple[str, str], tuple[float, float]] = {}
    for row in rows:
        if row["InstanceType"] and not row["AcceleratorName"]:
            od, spot = float(row["Price"] or 0), float(row["SpotPrice"] or 0)
            hosts[(row["InstanceType"], row["AvailabilityZone"])] = (od, spot)
    for row in rows:
        gpu = row["AcceleratorName"]
        if row["InstanceType"] or not gpu or gpu.startswith("tpu"):
            continue
        count = int(float(row["AcceleratorCount"]))
        host = host_instance_type(gpu, count)
        if host is None or (host, row["AvailabilityZone"]) not in hosts:
            continue
        acc_od, acc_spot = _price(row["Price"]), _price(row["SpotPrice"])
        if acc_od is None or acc_spot is None:
            continue
        host_od, host_spot = hosts[(host, row["AvailabilityZone"])]
        od = round(acc_od + host_od, 5)
        spot = round(acc_spot + host_spot, 5)
        yield Offer(
            cloud="gcp",
            region=row["Region"],
            zone=row["AvailabilityZone"],
            gpu_type=gpu,
            gpus_per_node=count,
            instance_type=host,
            ondemand_usd_per_hour=od,
            spot_usd_per_hour=spot,
            spot_above_ondemand=spot > od,
        )


def write_offers_csv(offers: Iterable[Offer], out: io.TextIOBase, provenance: str) -> int:
    """Write offers as CSV with a ``# provenance`` comment line first; return the row count."""
    out.write(f"# {provenance}\n")
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(OFFER_COLUMNS)
    n = 0
    unique = {(o.zone, o.gpu_type, o.gpus_per_node): o for o in offers}
    for key in sorted(unique):
        o = unique[key]
        writer.writerow(
            [
                o.cloud,
                o.region,
                o.zone,
                o.gpu_type,
                o.gpus_per_node,
                o.instance_type,
                f"{o.ondemand_usd_per_hour:.5f}",
                f"{o.spot_usd_per_hour:.5f}",
                int(o.spot_above_ondemand),
            ]
        )
        n += 1
    return n


SOURCE_COLUMNS = ("InstanceType", "AcceleratorName", "AcceleratorCount", "Price", "SpotPrice", "Region", "AvailabilityZone")
"""Columns of the SkyPilot-format source CSV that the derivation reads."""


def derive_file(source: str, dest: str) -> int:
    """Derive ``dest`` (the packaged offers CSV) from the SkyPilot-format ``source`` CSV; return
    the offer count. ``dest`` is replaced in one step (a temporary file renamed over it, with ``dest``'s
    mode), and only once the source has given at least one offer.

    Raises:
        ValueError: the source lacks a column the derivation reads, has a malformed row, or gives
            no offer; ``dest`` is then left as it was.
    """
    import contextlib
    import os
    import shutil

    with open(source, newline="") as f:
        reader = csv.DictReader(f)
        missing = [c for c in SOURCE_COLUMNS if c not in (reader.fieldnames or ())]
        if missing:
            raise ValueError(
                f"{source}: not a SkyPilot-format GCP catalog CSV: no column {', '.join(missing)} "
                f"(it needs {', '.join(SOURCE_COLUMNS)})"
            )
        try:
            offers = list(derive_offers(reader))
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{source}: line {reader.line_num}: {exc}") from None
    if not offers:
        raise ValueError(f"{source}: no GPU offer could be derived (no accelerator row with a host row and prices)")
    provenance = (
        f"provenance: derived by sailor_tasks/catalog/derive.py from {os.path.basename(source)} "
        "(daily mirror of SkyPilot's public GCP catalog v8); VM price = host row + accelerator row; "
        "700.0 placeholders and zero prices dropped; spot_above_ondemand flags dirty spot prices"
    )
    tmp = f"{dest}.tmp-{os.getpid()}"
    try:
        with open(tmp, "w", newline="") as out:
            n = write_offers_csv(offers, out, provenance)
        if os.path.exists(dest):
            shutil.copymode(dest, tmp)
        os.replace(tmp, dest)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    return n
