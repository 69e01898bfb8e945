"""A run's own ``command`` on the local backend: confined to the allowed roots, turned into torchrun's argv.

Whoever may trigger a run must not get arbitrary code execution on the Airflow worker, so a local
``command`` starts only a Python script or an executable that resolves (symlinks followed) inside
one of ``Settings.command_roots``, never a shell, never ``python -c``/``-m``. The same check runs
when the request is validated and again when the process group is launched (the file may have
changed in between). Torch-free.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from sailor_tasks.errors import InvalidRequestError

_PYTHON = re.compile(r"^python(3(\.\d+)?)?$")
"""A bare interpreter name: ``["python", "train.py", ...]`` runs ``train.py`` with SAILOR's Python."""

LOCAL_ENV_REFUSED = (
    "PATH",
    "HOME",
    "GCONV_PATH",
    "GETCONF_DIR",
    "HOSTALIASES",
    "LOCALDOMAIN",
    "LOCPATH",
    "MALLOC_TRACE",
    "NIS_PATH",
    "NLSPATH",
    "RESOLV_HOST_CONF",
    "RES_OPTIONS",
    "TMPDIR",
    "TZDIR",
    "GLIBC_TUNABLES",
    "BASH_ENV",
    "ENV",
    "CUDA_INJECTION64_PATH",
    "NVTX_INJECTION64_PATH",
    "NVTX_INJECTION32_PATH",
    "NCCL_CONF_FILE",
    "NCCL_NET_PLUGIN",
    "NCCL_TUNER_PLUGIN",
    "NCCL_PROFILER_PLUGIN",
    "NCCL_ENV_PLUGIN",
)
"""Env names a local run may not set: each makes the loader, a shell, a library or Python run or
read other files than the command's: glibc's list of variables it drops for setuid programs (and
``GLIBC_TUNABLES``), PATH and HOME (the interpreter and Python's user site-packages), a shell's
start-up file, the libraries CUDA, NVTX and NCCL load by name, and NCCL's configuration file
(its lines set NCCL's variables, the plugin names included)."""
LOCAL_ENV_REFUSED_PREFIXES = ("LD_", "DYLD_", "PYTHON", "OPENSSL_")
"""Prefixes a local run's env names may not have: the dynamic loader's (``LD_PRELOAD``, ...),
Python's (``PYTHONPATH``, ``PYTHONSTARTUP``, ...) and OpenSSL's (``OPENSSL_CONF``, whose providers
are shared libraries it loads when Python imports ``ssl`` or ``hashlib``) ways to load code from
elsewhere."""


@dataclass(frozen=True, slots=True)
class LocalCommand:
    """A confined command: what torchrun runs per worker."""

    program: str
    """Absolute real path of the script or executable."""
    args: tuple[str, ...]
    """Its arguments, passed as they are (no shell)."""
    python: bool
    """True: a Python script torchrun runs with SAILOR's interpreter; False: an executable
    (``torchrun --no-python``)."""
    root: str = ""
    """Real path of the allowed folder the command's name counts from (the root a relative name
    was found through; for an absolute one, the innermost root it lies in): the workers' working
    directory, so that a relative path in its arguments (``--config conf/a.yaml``) means what it
    means in the command, as in a container run from its project's folder."""

    def argv(self) -> list[str]:
        """The worker's own command line (a Python script runs with SAILOR's interpreter)."""
        return [*([sys.executable, "-u"] if self.python else []), self.program, *self.args]

    def torchrun_args(self) -> list[str]:
        """What follows torchrun's own options."""
        return [*([] if self.python else ["--no-python"]), self.program, *self.args]


def _inside(path: str, roots: Sequence[str]) -> bool:
    for root in roots:
        real = os.path.realpath(root)
        if path == real or path.startswith(real.rstrip("/") + "/"):
            return True
    return False


def _root_of(path: str, roots: Sequence[str]) -> str:
    """The real path of the innermost of ``roots`` that ``path`` (a real path) lies in."""
    inside = [r for r in map(os.path.realpath, roots) if path == r or path.startswith(r.rstrip("/") + "/")]
    return max(inside, key=len)


def _confine(name: str, roots: Sequence[str]) -> tuple[str, str]:
    """The real path of ``name`` (absolute, or relative to one of the roots: the first it is found
    in) and the root it counts from: the one a relative name was found through, else the
    innermost root an absolute one lies in."""
    shown = tuple(roots) or ("none: set SAILOR_COMMAND_ROOTS",)
    absolute = os.path.isabs(name)
    candidates = [(name, "")] if absolute else [(os.path.join(root, name), root) for root in roots]
    for candidate, through in candidates:
        real = os.path.realpath(candidate)
        if not _inside(real, roots):
            raise InvalidRequestError(
                "command",
                name,
                "lies outside the folders local commands may run from (add its folder to "
                "SAILOR_COMMAND_ROOTS of the Airflow workers)",
                shown,
            )
        if os.path.isfile(real):
            return real, _root_of(real, roots) if absolute else os.path.realpath(through)
    split = (
        " (it holds spaces: give one argument per list item, not a shell string)"
        if any(c.isspace() for c in name)
        else ""
    )
    raise InvalidRequestError(
        "command", name, f"no such file in the folders local commands may run from{split}", shown
    )


def resolve_local_command(command: Sequence[str], roots: Sequence[str]) -> LocalCommand:
    """Confine a run's ``command`` (argv) to ``roots``.

    Forms: ``[script.py, args...]`` or ``[python, script.py, args...]`` (a Python script, run by
    SAILOR's interpreter), or ``[executable, args...]``. Relative paths are looked up in each root
    in order; absolute ones must resolve inside a root.

    Raises:
        InvalidRequestError: (field ``command``) an empty command, a Python option instead of a
            script, a file outside the roots or missing, or a non-Python file that is not executable.
    """
    if not command:
        raise InvalidRequestError("command", list(command), "empty: name a script or executable to run")
    first, rest = command[0], tuple(command[1:])
    if "/" not in first and _PYTHON.match(first):
        if not rest or rest[0].startswith("-"):
            raise InvalidRequestError(
                "command",
                list(command)[:3],
                "the local backend runs a script file, never python options (-c, -m, ...): "
                "give [python, <script.py>, args...]",
            )
        script, root = _confine(rest[0], roots)
        return LocalCommand(script, rest[1:], python=True, root=root)
    program, root = _confine(first, roots)
    if program.endswith(".py"):
        return LocalCommand(program, rest, python=True, root=root)
    if not os.access(program, os.X_OK):
        raise InvalidRequestError("command", first, "is neither a .py script nor executable (chmod +x)")
    return LocalCommand(program, rest, python=False, root=root)


def check_local_env(env: dict[str, str]) -> list[InvalidRequestError]:
    """Errors for env names a local run may not set (``LOCAL_ENV_REFUSED``, ``LOCAL_ENV_REFUSED_PREFIXES``)."""
    bad = sorted(
        n for n in env if n in LOCAL_ENV_REFUSED or n.startswith(LOCAL_ENV_REFUSED_PREFIXES)
    )
    if not bad:
        return []
    return [
        InvalidRequestError(
            "env",
            bad,
            "names that load other code or files are refused on the local backend: "
            f"{', '.join(LOCAL_ENV_REFUSED)} and names starting {', '.join(LOCAL_ENV_REFUSED_PREFIXES)}",
        )
    ]
