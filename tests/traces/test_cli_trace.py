"""``sailor trace-gcp``: the GCP logs become a trace the preemption injector replays."""

from __future__ import annotations

from sailor_tasks.backends.preemption import InjectionSpec, time_events
from sailor_tasks.cli.main import main
from sailor_tasks.traces.availability import load_availability_trace


def test_zone_trace_written_and_replayable(shared_data, tmp_path, capsys):
    out = tmp_path / "west.json"
    logs = str(shared_data / "gcp_preemption_2020" / "logs")
    assert main(["trace-gcp", "--logs", logs, "--zone", "us-west1-b", "--out", str(out)]) == 0
    trace = load_availability_trace(str(out))
    assert trace.gap_seconds == 900 and trace.preemption_times()
    # 1 trace hour per wall second: the first loss of capacity fires that many seconds after launch.
    events = time_events(InjectionSpec(trace_uri=str(out), trace_time_scale=3600.0), 1, 0.0)
    assert events[0].at_s == trace.preemption_times()[0] / 3600.0
    assert main(["trace-gcp", "--logs", logs, "--zone", "nope"]) == 2
    assert "zone='nope'" in capsys.readouterr().err


def test_an_unwritable_out_path_is_bad_input_naming_it(shared_data, tmp_path, capsys):
    logs = str(shared_data / "gcp_preemption_2020" / "logs")
    out = tmp_path / "no-such-folder" / "west.json"
    assert main(["trace-gcp", "--logs", logs, "--zone", "us-west1-b", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: --out {str(out)!r}: ") and "No such file or directory" in err
    assert not out.exists()


def test_an_unknown_gpu_type_is_bad_input_listing_the_logs_types(shared_data, capsys):
    """It printed every zone with 0 preemptions, or blamed the zone."""
    logs = str(shared_data / "gcp_preemption_2020" / "logs")
    for zone in ([], ["--zone", "us-central1-c"]):
        assert main(["trace-gcp", "--logs", logs, "--gpu", "bogus", *zone]) == 2
        err = capsys.readouterr().err
        assert "--gpu 'bogus': no instance of it in the logs; valid: " in err and "nvidia-tesla-v100" in err


def test_a_zone_without_the_gpu_type_is_refused_naming_the_zones_with_it(shared_data, capsys):
    logs = str(shared_data / "gcp_preemption_2020" / "logs")
    argv = ["trace-gcp", "--logs", logs, "--gpu", "nvidia-tesla-v100"]
    assert main([*argv, "--zone", "us-east1-c"]) == 2
    err = capsys.readouterr().err
    assert "zone='us-east1-c' has no nvidia-tesla-v100 instances in the logs; " in err
    listed = err.split("zones with nvidia-tesla-v100 instances: ")[1].strip().split(", ")
    assert "us-east1-c" not in listed and "us-west1-b" in listed
    # the stats for that GPU type leave the zone out rather than show it at 0 preemptions/h
    assert main(argv) == 0
    assert "us-east1-c" not in capsys.readouterr().out
