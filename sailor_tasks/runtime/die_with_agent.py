"""Start a worker that dies with the torchrun agent that started it (Linux ``PR_SET_PDEATHSIG``).

torchrun starts each worker in a session of its own, so a SIGKILL of the agent (an OOM kill, a
kill -9 of the task) leaves its workers running, training and writing checkpoints for an attempt
that has ended. The local backend has torchrun run this module before each worker (``torchrun
--no-python python -m sailor_tasks.runtime.die_with_agent <worker argv>``): it asks the kernel to
send the process SIGKILL when its parent exits, checks the parent did not exit already, then
``exec``s the worker's own command, which keeps the setting (same process, same parent). With
``--cwd DIR`` first, the worker runs in ``DIR`` (torchrun and this module start in the task's
working directory, whose files then cannot shadow their modules).

Torch-free and import-light: it runs once per worker before the worker's interpreter starts.
"""

from __future__ import annotations

import ctypes
import functools
import os
import signal
import sys

PR_SET_PDEATHSIG = 1
"""``prctl`` option (linux/prctl.h): the signal the process gets when its parent thread exits."""


@functools.cache
def libc() -> ctypes.CDLL:
    """The C library's symbols, as this process already has them (no search for the file: the
    lookup runs ``ldconfig``, which a ``preexec_fn`` must not do between fork and exec). Load it
    before forking to keep the child's work to the ``prctl`` call."""
    return ctypes.CDLL(None, use_errno=True)


def set_parent_death_signal(sig: int = signal.SIGKILL) -> bool:
    """Ask the kernel to send ``sig`` to this process when its parent exits; False where the
    system has no ``prctl`` (not Linux)."""
    if not sys.platform.startswith("linux"):
        return False
    if libc().prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"prctl(PR_SET_PDEATHSIG): {os.strerror(err)}")
    return True


def _parent_is_agent(ppid: int) -> bool:
    """Whether ``ppid`` is still a torchrun agent (it may have died before the setting took hold,
    and this process been adopted by init or a subreaper): ``python -m torch.distributed.run``, or
    the ``torchrun`` console script (``python .../bin/torchrun``)."""
    try:
        with open(f"/proc/{ppid}/cmdline", "rb") as f:
            argv = f.read().split(b"\0")
    except OSError:
        return False
    return any(b"torch.distributed" in a or os.path.basename(a) == b"torchrun" for a in argv)


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    workdir = None
    if args[:1] == ["--cwd"] and len(args) >= 2:
        workdir, args = args[1], args[2:]
    if args[:1] == ["--"]:
        args = args[1:]
    if not args:
        sys.exit("usage: python -m sailor_tasks.runtime.die_with_agent [--cwd DIR] [--] PROGRAM [ARGS...]")
    ppid = os.getppid()
    if set_parent_death_signal() and (os.getppid() != ppid or not _parent_is_agent(ppid)):
        os.kill(os.getpid(), signal.SIGKILL)  # the agent is gone already: never start the worker
    if workdir is not None:
        os.chdir(workdir)  # the worker's own working directory (``--cwd``), not the agent's
    os.execvp(args[0], args)


if __name__ == "__main__":
    main()
