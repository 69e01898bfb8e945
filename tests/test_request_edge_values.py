"""Hostile or odd param values get a clear, bounded refusal naming the param (and a rejected
ledger row), never a traceback or a silently ignored setting; names stay names on the command line."""

from __future__ import annotations

import json

import pytest

from sailor_tasks import stages
from sailor_tasks.errors import InvalidRequestErrors


def _ctx():
    from sailor_tasks.settings import Settings
    from sailor_tasks.stages import StageContext

    return StageContext(Settings.from_env())


def test_lone_surrogate_job_name_is_rejected_cleanly(settings, demo_dataset):
    ctx = _ctx()
    params = json.loads('{"job_name": "bad\\ud800"}')
    params["dataset_uri"] = demo_dataset
    with pytest.raises(InvalidRequestErrors) as info:
        stages.validate(params, "surrogate", ctx)
    assert info.value.field == "job_name"
    assert ctx.ledger.get_run("surrogate")["status"] == "rejected"


@pytest.mark.parametrize(
    ("params", "field", "why"),
    [
        ('{"env": {"FOO": "ok", "BAR": "\\ud800"}}', "env", "values must be Unicode text"),
        ('{"command": ["python", "x.py", "\\udfff"]}', "command", "every argument must be Unicode text"),
        (
            '{"command": ["python train.py --lr 0.1"], "backend": "gke"}',
            "command",
            "one argument per list item",
        ),
    ],
)
def test_code_params_no_process_could_run_are_refused_at_validate(settings, demo_dataset, params, field, why):
    """A lone surrogate (valid JSON) cannot reach a process's argv or environment; a whole command
    line typed on one line of the trigger form is one argument: both refused before any capacity
    is reserved, not at launch."""
    ctx = _ctx()
    values = {**json.loads(params), "dataset_uri": demo_dataset}
    with pytest.raises(InvalidRequestErrors, match=why) as info:
        stages.validate(values, "bad-code", ctx)
    assert info.value.field == field
    assert ctx.ledger.get_run("bad-code")["status"] == "rejected"


def test_a_command_with_spaces_inside_one_of_several_arguments_is_kept():
    from sailor_tasks.request import from_params

    assert from_params({"command": ["python", "my train.py"], "backend": "gke"}).command == (
        "python",
        "my train.py",
    )


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("[" * 200_000 + "]" * 200_000, "JSON nested too deeply"),
        (
            '{"metadata": {"gap_seconds": Infinity}, "data": [0, 1, 0]}',
            "gap_seconds=inf must be a finite number > 0",
        ),
        (
            json.dumps({"metadata": {"gap_seconds": "x" * 1_000_000}, "data": [0]}),
            "chars) must be a finite number",
        ),
    ],
    ids=["nested-too-deeply", "infinite-gap", "huge-gap-value"],
)
def test_a_bad_trace_file_is_refused_in_a_short_message(
    settings, demo_dataset, tmp_path, monkeypatch, text, why
):
    root = tmp_path / "data"
    root.mkdir()
    (root / "trace.json").write_text(text)
    monkeypatch.setenv("SAILOR_DATA_ROOTS", str(root))
    ctx = _ctx()
    with pytest.raises(InvalidRequestErrors) as info:
        stages.validate(
            {"dataset_uri": demo_dataset, "preemption_trace_uri": f"file://{root}/trace.json"}, "trace", ctx
        )
    assert info.value.field == "preemption_trace_uri" and why in str(info.value)
    assert len(str(info.value)) < 2_000
    assert ctx.ledger.get_run("trace")["status"] == "rejected"


@pytest.mark.parametrize("item", ["job_name=2024", "team=42", "job_name=1e3", "job_name=true"])
def test_set_numeric_looking_name_stays_a_string(settings, capsys, item):
    from sailor_tasks.cli.main import main as sailor
    from sailor_tasks.cli.output import load_params

    rc = sailor(["plan", "--set", item])
    assert rc == 0, capsys.readouterr().err
    key, _, text = item.partition("=")
    assert load_params(None, [item]) == {key: text}
    assert load_params(None, ["num_workers=2", "regions=[]"]) == {
        "num_workers": 2,
        "regions": [],
    }  # JSON still


def test_huge_int_is_refused_with_invalid_request_error():
    from sailor_tasks.request import from_params

    with pytest.raises(InvalidRequestErrors) as info:
        from_params({"total_steps": 10**5000, "job_name": 10**5000})
    assert {e.field for e in info.value.errors} >= {"total_steps", "job_name"}
    assert "an integer of 16610 bits" in str(info.value) and len(str(info.value)) < 2_000


def test_a_zero_price_cap_is_refused_by_the_params_themselves():
    """No offer costs nothing: the form and the REST API refuse 0 as the params' own bound, before
    anything is planned, as they do a zero deadline."""
    from sailor_tasks.request import from_params

    for field in ("max_usd_per_hour", "deadline_hours"):
        with pytest.raises(InvalidRequestErrors) as info:
            from_params({field: 0})
        assert [e.field for e in info.value.errors] == [field]
        assert "less than or equal to the minimum of 0" in str(info.value)


@pytest.mark.parametrize(
    ("setting", "field"),
    [
        ("max_usd_per_hour=0.01", "max_usd_per_hour"),
        ("deadline_hours=0.01", "deadline_hours"),
        ("num_workers=256", "num_workers"),
    ],
)
def test_submit_refuses_what_no_offer_can_ever_serve_before_triggering(
    settings, monkeypatch, capsys, setting, field
):
    from sailor_tasks.cli import submit
    from sailor_tasks.cli.main import main as sailor

    calls = []

    class Fake:
        def get_dag(self, dag_id):
            calls.append("get_dag")
            return {"is_paused": False}

        def trigger(self, dag_id, conf, note=None):
            calls.append("trigger")
            return {"dag_run_id": "manual__x"}

    monkeypatch.setattr(submit, "client_from_args", lambda args: Fake())
    rc = sailor(["submit", "--set", setting, "--no-wait"])
    err = capsys.readouterr().err
    assert rc == 2 and "trigger" not in calls, (rc, calls, err)
    assert field in err


def test_late_injection_steps_are_named_under_their_own_field():
    from sailor_tasks.request import from_params

    with pytest.raises(InvalidRequestErrors) as info:
        from_params({"total_steps": 300, "inject_preemptions": [500], "inject_kills": [400]})
    by_field = {e.field: e.value for e in info.value.errors}
    assert by_field.get("inject_preemptions") == [500], str(info.value)
    assert by_field.get("inject_kills") == [400], str(info.value)


@pytest.mark.parametrize(
    "params",
    [
        {"inject_preemptions": [10]},
        {"inject_kills": [10]},
        {"preemption_rate_per_hour": 2.0},
        {"preemption_trace_uri": "gs://corp/trace.json"},
        {"preemption_trace_time_scale": 5},
    ],
    ids=["inject_preemptions", "inject_kills", "rate", "trace", "trace_time_scale"],
)
def test_local_only_injection_params_are_refused_on_gke(params):
    from sailor_tasks.catalog import load_catalog
    from sailor_tasks.request import from_params

    with pytest.raises(InvalidRequestErrors) as info:
        from_params({"backend": "gke", **params}, load_catalog())
    assert info.value.field in params


def test_a_trace_speed_up_without_a_trace_is_refused_naming_both():
    from sailor_tasks.catalog import load_catalog
    from sailor_tasks.request import from_params

    with pytest.raises(InvalidRequestErrors) as info:
        from_params({"preemption_trace_time_scale": 3600}, load_catalog())
    assert info.value.field == "preemption_trace_time_scale" and "preemption_trace_uri" in str(info.value)
    req = from_params(
        {"preemption_trace_time_scale": 3600, "preemption_trace_uri": "file:///tmp/t.json"}, load_catalog()
    )
    assert req.preemption_trace_time_scale == 3600.0


def test_huge_reserved_env_name_is_cut_in_the_message():
    from sailor_tasks.request import from_params

    with pytest.raises(InvalidRequestErrors) as info:
        from_params({"env": {"SAILOR_" + "X" * 1_000_000: "v"}})
    assert len(str(info.value)) < 2_000, len(str(info.value))


@pytest.mark.parametrize(
    ("params", "field", "why"),
    [
        ({"data_residency": ["AF"]}, "data_residency", "data_residency: "),
        ({"regions": ["us-central1"], "data_residency": ["EU"]}, "data_residency", "region_allowed: "),
        (
            {"num_workers": 256, "max_usd_per_hour": 1000},
            "num_workers",
            "256 GPUs are more than any zone has",
        ),
        ({"num_workers": 256}, "num_workers", "256 GPUs are more than any zone has"),
    ],
    ids=[
        "no-region-on-the-continent",
        "allowed-regions-off-the-continent",
        "more-gpus-than-any-zone",
        "default-cap",
    ],
)
def test_a_request_no_offer_can_ever_serve_is_refused_by_validate(settings, demo_dataset, params, field, why):
    """Nothing reserved would change it: refused at validate, naming the param to change, never
    queued or planned; and the price-cap advice never names an offer that cannot hold the run."""
    ctx = _ctx()
    with pytest.raises(InvalidRequestErrors) as info:
        stages.validate({"dataset_uri": demo_dataset, **params}, "never", ctx)
    assert info.value.field == field and why in str(info.value)
    assert "raise it to at least" not in str(info.value)
    assert ctx.ledger.get_run("never")["status"] == "rejected"
    assert ctx.ledger.queue_entry("never") is None and ctx.ledger.live_reservations() == []


def test_a_deadline_shorter_than_the_fastest_possible_run_is_refused_by_validate(settings, demo_dataset):
    """No queue position or placement could meet it: refused at validate, naming the fastest offer
    and the least deadline that could; that deadline passes."""
    import re

    ctx = _ctx()
    params = {"dataset_uri": demo_dataset, "total_steps": 200_000, "gpu_type": "T4"}
    with pytest.raises(InvalidRequestErrors) as info:
        stages.validate({**params, "deadline_hours": 0.05}, "hopeless", ctx)
    assert info.value.field == "deadline_hours" and "shorter than the fastest possible run" in str(info.value)
    assert "T4" in str(info.value)
    assert ctx.ledger.get_run("hopeless")["status"] == "rejected"
    assert ctx.ledger.queue_entry("hopeless") is None and ctx.ledger.live_reservations() == []
    least = float(re.search(r"set at least ([0-9.]+)", str(info.value)).group(1))
    assert least > 0.1  # the training itself, not only the launch
    request = stages.validate({**params, "deadline_hours": least}, "possible", ctx)
    assert request["deadline_hours"] == least
