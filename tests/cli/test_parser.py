"""The ``sailor`` command's parser: every option has help, help is plain text, ``--json`` prints
JSON everywhere, exit codes are documented, ``--version`` answers."""

from __future__ import annotations

import argparse
import os
import re

import pytest

from sailor_tasks.cli.main import build_parser, options_without_help, walk
from sailor_tasks.cli.main import main as sailor


def test_every_option_and_argument_of_every_command_has_help():
    assert options_without_help(build_parser()) == []


def test_every_command_has_a_one_line_help():
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    helps = {a.dest: a.help for a in sub._choices_actions}
    assert set(helps) == set(sub.choices) and all(helps.values())


def test_help_is_plain_text_without_rest_markup():
    markup = re.compile(r"``|:(class|func|meth|mod|ref):`")
    parser = build_parser()
    texts = [parser.format_help()] + [p.format_help() for _, p in walk(parser)]
    offending = [line for text in texts for line in text.splitlines() if markup.search(line)]
    assert offending == []


def test_json_is_a_flag_that_prints_json_wherever_it_exists():
    for path, p in walk(build_parser()):
        for action in p._actions:
            if "--json" in action.option_strings:
                assert action.nargs == 0 and action.const is True, path  # store_true, takes no value


def test_top_level_help_lists_the_exit_codes(capsys):
    with pytest.raises(SystemExit) as done:
        sailor(["--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    for code in ("0  ok", "1  failed", "2  bad input", "3  not found or unreachable"):
        assert code in out


def test_version(capsys):
    with pytest.raises(SystemExit) as done:
        sailor(["--version"])
    assert done.value.code == 0 and re.fullmatch(r"sailor \S+\n", capsys.readouterr().out)


def test_bad_choice_is_bad_input_naming_the_value_and_the_choices(capsys):
    with pytest.raises(SystemExit) as done:
        sailor(["render", "--backend", "aws"])
    assert done.value.code == 2
    err = capsys.readouterr().err
    assert "'aws'" in err and "gke" in err


def test_every_seed_option_refuses_a_negative_seed_before_running(capsys):
    commands = [path for path, p in walk(build_parser()) for a in p._actions if "--seed" in a.option_strings]
    assert len(commands) >= 2
    for path in commands:
        with pytest.raises(SystemExit) as done:
            sailor([*path.split()[1:], "--seed", "-1"])
        assert done.value.code == 2, path
        assert "argument --seed: '-1': need an integer ≥ 0" in capsys.readouterr().err, path


def test_every_wait_and_poll_option_refuses_zero_and_negative_seconds(capsys):
    flags = ("--poll", "--timeout", "--gap", "--time-limit")
    found = []
    for path, p in walk(build_parser()):
        for action in p._actions:
            for flag in set(flags) & set(action.option_strings):
                found.append((path, flag))
                for value in ("0", "-1", "nan"):
                    with pytest.raises(SystemExit) as done:
                        sailor([*path.split()[1:], flag, value])
                    assert done.value.code == 2, (path, flag, value)
                    assert f"argument {flag}: '{value}': need a number > 0" in capsys.readouterr().err
    assert {path for path, _ in found} >= {
        "sailor submit",
        "sailor cancel",
        "sailor logs",
        "sailor trace-gcp",
    }


def test_demo_refuses_bad_conf_before_any_setup(settings, monkeypatch, capsys):
    from sailor_tasks.cli import demo

    started = []
    monkeypatch.setattr(demo, "_airflow", lambda *argv: started.append(argv) or 0)
    for conf, message in (
        ("{bad", "--conf '{bad' is not JSON"),
        ("[1]", "must be a JSON object of sailor_train params"),
        ('{"num_workers": 0}', "--conf: num_workers=0: 0 is less than the minimum of 1"),
    ):
        assert sailor(["demo", "--conf", conf]) == 2, conf
        assert message in capsys.readouterr().err, conf
    assert started == [] and not os.path.exists(settings.state_dir)  # no Airflow run, no demo dataset


@pytest.mark.parametrize("command", ["plan", "render"])
def test_unreadable_params_and_malformed_overrides_are_bad_input(command, tmp_path, settings, capsys):
    flag = [] if command == "plan" else ["--params"]
    assert sailor([command, *flag, str(tmp_path / "missing.json")]) == 2
    assert "cannot read params from" in capsys.readouterr().err
    (tmp_path / "list.json").write_text("[1, 2]")
    assert sailor([command, *flag, str(tmp_path / "list.json")]) == 2
    assert "must hold a JSON object" in capsys.readouterr().err
    assert sailor([command, "--set", "num_workers"]) == 2
    assert "--set 'num_workers' is not KEY=VALUE" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv",
    [
        ["plan", "--set", "num_workers=2"],
        ["submit", "--set", "num_workers=2"],
        ["catalog"],
        ["catalog", "transfer"],
    ],
)
def test_an_unreadable_catalog_file_is_bad_input_named_without_a_traceback(
    argv, settings, monkeypatch, capsys
):
    from sailor_tasks.catalog import load_catalog

    monkeypatch.setenv("SAILOR_CATALOG_FILE", "/nonexistent/offers.csv")
    load_catalog.cache_clear()
    try:
        assert sailor(argv) == 2
    finally:
        load_catalog.cache_clear()
    err = capsys.readouterr().err
    assert "error: the catalog cannot be loaded" in err and "/nonexistent/offers.csv" in err
    assert "Traceback" not in err


def test_a_reader_that_closes_the_pipe_early_gets_no_traceback(tmp_path):
    """`sailor catalog --json | head -c 10`: the command stops with status 1, quietly."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "SAILOR_STATE_DIR": str(tmp_path)}
    cmd = [sys.executable, "-m", "sailor_tasks.cli", "catalog", "--json"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    proc.stdout.read(10)
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait() == 1 and "Traceback" not in err and "BrokenPipe" not in err, err


def test_plan_places_on_the_market_the_runs_strategy_chooses(settings, demo_dataset, capsys):
    """`sailor plan` plans as the plan stage does: strategy on_demand never shows a spot
    placement, which the engine's own auto market would pick."""
    import json

    base = ["plan", "--set", f"dataset_uri={json.dumps(demo_dataset)}", "--set", 'gpu_type="A100"']
    assert sailor([*base, "--set", 'strategy="on_demand"']) == 0
    out = capsys.readouterr().out
    assert out.startswith("market: on_demand") and " spot " not in out.splitlines()[1]
    assert sailor([*base, "--set", 'strategy="on_demand"', "--json"]) == 0
    decision = json.loads(capsys.readouterr().out)
    assert decision["market_decision"]["market"] == "on_demand"
    assert decision["placement"]["market"] == "on_demand"


def test_a_string_param_keeps_the_text_null_unless_it_may_be_null():
    """``--set`` values are JSON, but a string param keeps its text: ``job_name=2024`` and
    ``job_name=null`` are names; ``image=null`` (a param that may be null) is null."""
    from sailor_tasks.cli.output import load_params

    params = load_params(None, ["job_name=null", "team=2024", "image=null", "num_workers=2"])
    assert params == {"job_name": "null", "team": "2024", "image": None, "num_workers": 2}


def test_plan_keeps_to_the_residency_of_the_dataset_spelled_by_its_bucket_path(ctx, demo_dataset, capsys):
    """`sailor plan` keys the dataset as validate does: named by its concrete path in the source
    bucket, it keeps the data_residency another run of it declared."""
    import json

    from sailor_tasks import stages, storage

    stages.validate({"dataset_uri": demo_dataset, "data_residency": ["EU"]}, "eu-only", ctx)
    concrete = storage.resolve(demo_dataset, ctx.settings)
    assert sailor(["plan", "--set", f"dataset_uri={json.dumps(concrete)}", "--json"]) == 0
    placement = json.loads(capsys.readouterr().out)["placement"]
    assert ctx.catalog.transfer.continent(placement["region"]) == "EU"
