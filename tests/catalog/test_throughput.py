from __future__ import annotations

import pytest

from sailor_tasks.catalog.throughput import (
    MODEL_JOB_TYPES,
    RELATIVE_TO_V100,
    ThroughputTable,
    load_gavel,
    load_packaged,
    model_speed,
)

JOB = ("ResNet-50 (batch size 64)", 1)


def test_packaged_table_has_gavel_gpus_and_newer_ones():
    t = load_packaged()
    assert {"K80", "P100", "V100", "A100", "H100", "L4", "T4"} <= set(t.gpu_types)
    assert len(t.job_types) == 83
    # Gavel's measurement for ResNet-50 (bs 64): V100 ≈ 4.39 steps/s, K80 ≈ 0.62.
    assert t.throughput(JOB, "V100") == pytest.approx(4.39, abs=0.01)
    assert t.throughput(JOB, "K80") == pytest.approx(0.62, abs=0.01)
    assert t.speedup(JOB, "A100") == pytest.approx(RELATIVE_TO_V100["A100"])


def test_every_builtin_model_has_a_speed_on_every_catalog_gpu():
    from sailor_tasks.catalog import load_catalog

    t = load_packaged()
    for model in MODEL_JOB_TYPES:
        speeds = model_speed(t, model, load_catalog().gpu_types)
        assert all(v > 0 for v in speeds.values()), (model, speeds)


def test_measurement_feedback_blends_and_validates():
    t = ThroughputTable(alone={JOB: {"V100": 4.0}})
    assert t.with_measurement(JOB, "V100", 6.0, weight=0.5).throughput(JOB, "V100") == 5.0
    assert t.with_measurement(JOB, "T4", 1.5).throughput(JOB, "T4") == 1.5
    with pytest.raises(ValueError, match="weight"):
        t.with_measurement(JOB, "V100", 1.0, weight=0)


def test_full_gavel_file_has_space_sharing_pairs(shared_data):
    t = load_gavel(str(shared_data / "gavel" / "simulation_throughputs.json"))
    a, b = ("ResNet-18 (batch size 16)", 1), ("ResNet-18 (batch size 64)", 1)
    ta, tb = t.pair(a, b, "V100")
    assert ta < t.throughput(a, "V100") + 1e-9 and tb > 0
    assert t.pair(b, a, "V100") == (tb, ta)
    assert t.throughput(JOB, "V100", consolidated=False) > 0


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("zz", "not JSON"),
        ("{}", "an object keyed by GPU type (k80, p100, v100"),
        ('{"tpu": {}}', "GPU type key 'tpu' is not one of Gavel's: k80, k80_unconsolidated"),
        ('{"v100": {"x": 1}}', "'v100' is not job key"),
        ('{"v100": {}}', "no job has a throughput alone"),
    ],
)
def test_a_file_that_is_not_gavels_table_is_refused_naming_the_file_and_entry(tmp_path, text, message):
    path = tmp_path / "throughputs.json"
    path.write_text(text)
    with pytest.raises(ValueError, match=r"throughputs\.json: ") as err:
        load_gavel(str(path))
    assert message in str(err.value)


def test_a_measurement_reaches_multi_vm_placements_too():
    from sailor_tasks.catalog.throughput import MODEL_JOB_TYPES, packaged_with_measured

    job = MODEL_JOB_TYPES["tiny_gpt"]
    base = packaged_with_measured(())
    measured = packaged_with_measured((("tiny_gpt", "A100", 10.0),))
    factor = measured.throughput(job, "A100", True) / base.throughput(job, "A100", True)
    assert measured.throughput(job, "A100", False) == pytest.approx(
        base.throughput(job, "A100", False) * factor
    )


def test_learned_speeds_follow_the_runs_median_not_one_far_off_run():
    """Twenty runs near the table's speed and one 100 times faster (a mis-timed run): the entry
    stays with the twenty. Runs that agree on another speed move it there, the table's own value
    counting as one of them."""
    from sailor_tasks.catalog.throughput import MODEL_JOB_TYPES, packaged_with_measured

    key = MODEL_JOB_TYPES["gpt_25m"]
    packaged = packaged_with_measured(()).throughput(key, "A100")
    good = [("gpt_25m", "A100", packaged * f) for f in (0.9, 1.1) * 10]
    learned = packaged_with_measured((*good, ("gpt_25m", "A100", packaged * 100))).throughput(key, "A100")
    assert learned == pytest.approx(packaged, rel=0.1)
    slower = tuple(("gpt_25m", "A100", packaged / 2) for _ in range(3))
    assert packaged_with_measured(slower).throughput(key, "A100") == pytest.approx(packaged / 2)
