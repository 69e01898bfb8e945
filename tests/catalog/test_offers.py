from __future__ import annotations

import csv
import io

from sailor_tasks.catalog import load_catalog
from sailor_tasks.catalog.derive import derive_offers, host_instance_type, write_offers_csv

HEADER = "InstanceType,vCPUs,MemoryGiB,AcceleratorName,AcceleratorCount,GpuInfo,Region,AvailabilityZone,Price,SpotPrice"


def _rows(text: str):
    return list(csv.DictReader(io.StringIO(HEADER + "\n" + text)))


def test_vm_price_is_host_plus_accelerator():
    rows = _rows(
        "n1-standard-8,8,30,,,,us-east1,us-east1-b,0.38,0.08\n,,,V100,1,{},us-east1,us-east1-b,2.48,0.74\n"
    )
    (offer,) = derive_offers(rows)
    assert offer.instance_type == "n1-standard-8"
    assert offer.ondemand_usd_per_hour == 2.86
    assert offer.spot_usd_per_hour == 0.82
    assert not offer.spot_above_ondemand


def test_placeholder_and_zero_prices_are_dropped_and_dirty_spot_flagged():
    rows = _rows(
        "a2-ultragpu-1g,12,170,,,,us-central1,us-central1-a,0.5,0.2\n"
        "a2-highgpu-1g,12,85,,,,us-central1,us-central1-a,0.9,0.4\n"
        "g2-standard-4,4,16,,,,us-central1,us-central1-a,0.2,0.1\n"
        ",,,A100-80GB,1,{},us-central1,us-central1-a,1.0,2.0\n"
        ",,,A100,1,{},us-central1,us-central1-a,700.0,0.5\n"
        ",,,L4,1,{},us-central1,us-central1-a,0.0,0.2\n"
    )
    offers = list(derive_offers(rows))
    assert [o.gpu_type for o in offers] == ["A100-80GB"]
    assert offers[0].spot_above_ondemand


def test_accelerator_without_its_host_in_the_zone_is_skipped():
    rows = _rows(",,,H100,8,{},us-west1,us-west1-a,80.0,30.0\n")
    assert list(derive_offers(rows)) == []
    assert host_instance_type("H100", 8) == "a3-highgpu-8g"
    assert host_instance_type("TPU", 1) is None


def test_written_csv_starts_with_provenance():
    rows = _rows(
        "n1-standard-8,8,30,,,,us-east1,us-east1-b,0.38,0.08\n,,,T4,1,{},us-east1,us-east1-b,0.35,0.1\n"
    )
    out = io.StringIO()
    assert write_offers_csv(derive_offers(rows), out, "provenance: test") == 1
    assert out.getvalue().startswith("# provenance: test\n")


def test_packaged_catalog_is_real_gcp_data():
    cat = load_catalog()
    assert len(cat.offers) > 500
    assert {"us-central1", "europe-west4", "asia-east1"} <= set(cat.regions)
    assert {"H100", "A100", "L4", "T4", "V100"} <= set(cat.gpu_types)
    for o in cat.offers:
        assert 0 < o.spot_usd_per_hour and 0 < o.ondemand_usd_per_hour < 700
        assert o.zone.startswith(o.region)


def test_packaged_catalog_matches_a_fresh_derivation(shared_data, tmp_path):
    from sailor_tasks.catalog.derive import derive_file
    from sailor_tasks.catalog.offers import read_offers

    out = tmp_path / "offers.csv"
    derive_file(str(shared_data / "catalog" / "gcp_vms_2026-05-20.csv"), str(out))
    assert read_offers(str(out)) == read_offers()  # the packaged file, before supply is applied


def test_derive_refuses_a_source_that_is_not_the_catalog_and_leaves_the_offers_file_as_it_was(tmp_path, capsys):
    import os

    from sailor_tasks.cli.main import main as sailor

    dest = tmp_path / "offers.csv"
    dest.write_text("# the offers before\n")
    os.chmod(dest, 0o644)
    header = "InstanceType,AcceleratorName,AcceleratorCount,Price,SpotPrice,Region,AvailabilityZone\n"
    cases = {
        "a,b\n1,2\n": "no column InstanceType",
        header + ",V100,x,1.0,0.5,us-east1,us-east1-b\n": "line 2: could not convert string to float: 'x'",
        header: "no GPU offer could be derived",
    }
    for i, (text, message) in enumerate(cases.items()):
        source = tmp_path / f"source{i}.csv"
        source.write_text(text)
        assert sailor(["catalog", "derive", "--source", str(source), "--dest", str(dest)]) == 2
        err = capsys.readouterr().err
        assert message in err and f"{dest} is unchanged" in err, err
        assert dest.read_text() == "# the offers before\n"
    assert sorted(os.listdir(tmp_path)) == ["offers.csv", "source0.csv", "source1.csv", "source2.csv"]

    good = tmp_path / "vms.csv"
    good.write_text(
        header + "n1-standard-8,,,0.38,0.08,us-east1,us-east1-b\n,V100,1,2.48,0.74,us-east1,us-east1-b\n"
    )
    assert sailor(["catalog", "derive", "--source", str(good), "--dest", str(dest)]) == 0
    assert "wrote 1 offers" in capsys.readouterr().out
    assert "us-east1-b,V100,1,n1-standard-8,2.86000,0.82000" in dest.read_text()
    assert os.stat(dest).st_mode & 0o777 == 0o644  # replaced in one step, with the mode it had
    assert sorted(os.listdir(tmp_path)) == ["offers.csv", "source0.csv", "source1.csv", "source2.csv", "vms.csv"]


def test_a_truncated_or_bad_offers_file_is_a_catalog_error_naming_the_row_and_column(tmp_path):
    import pytest

    from sailor_tasks.catalog.offers import DEFAULT_OFFERS_FILE, _packaged
    from sailor_tasks.errors import CatalogError

    lines = [line for line in open(_packaged(DEFAULT_OFFERS_FILE)) if not line.startswith("#")][:4]
    cut = tmp_path / "cut.csv"
    cut.write_text("".join(lines[:3]) + ",".join(lines[3].split(",")[:3]) + "\n")
    with pytest.raises(CatalogError, match=rf"{cut}: data row 3: no value for gpu_type, gpus_per_node"):
        load_catalog(str(cut))
    header, first = lines[0], lines[1].split(",")
    col = header.strip().split(",").index("spot_usd_per_hour")
    first[col] = "cheap"
    bad = tmp_path / "bad.csv"
    bad.write_text(header + ",".join(first))
    with pytest.raises(CatalogError, match=rf"{bad}: data row 1: spot_usd_per_hour='cheap' is not a number"):
        load_catalog(str(bad))


def test_impossible_offers_and_an_empty_offers_file_are_catalog_errors_naming_them(tmp_path):
    """0 GPUs per VM (a run then got '0x V100'), NaN or infinite or negative prices (NaN became
    null in JSON), a file with no offer, and a line CSV cannot read."""
    import pytest

    from sailor_tasks.catalog.offers import DEFAULT_OFFERS_FILE, _packaged
    from sailor_tasks.errors import CatalogError

    lines = [line for line in open(_packaged(DEFAULT_OFFERS_FILE)) if not line.startswith("#")]
    header = lines[0]
    columns = header.strip().split(",")
    for column, value in (
        ("gpus_per_node", "0"),
        ("ondemand_usd_per_hour", "nan"),
        ("spot_usd_per_hour", "inf"),
        ("ondemand_usd_per_hour", "-1.5"),
    ):
        row = lines[1].rstrip("\n").split(",")
        row[columns.index(column)] = value
        bad = tmp_path / f"{column}.csv"
        bad.write_text(header + ",".join(row) + "\n")
        with pytest.raises(CatalogError, match=rf"data row 1: {column}='{value}': need a finite number"):
            load_catalog(str(bad))
    empty = tmp_path / "empty.csv"
    empty.write_text(header)
    with pytest.raises(CatalogError, match=rf"{empty}: no offer"):
        load_catalog(str(empty))
    huge = tmp_path / "huge.csv"
    huge.write_text(header + lines[1] + '"' + "x" * 200_000 + '"\n')
    with pytest.raises(CatalogError, match=rf"{huge}: data row 2: field larger than field limit"):
        load_catalog(str(huge))
