"""The local backend: a "cluster" is a record file plus a torchrun process group on this machine.

Region buckets are folders under the state folder (see ``Settings.bucket_template``); everything
a cloud run does happens here for real: data copies, training, checkpoints, restarts.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import json
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from sailor_tasks import paths, storage
from sailor_tasks.backends.base import TrainLaunch
from sailor_tasks.backends.local_command import resolve_local_command
from sailor_tasks.backends.preemption import InjectionSpec, PreemptionEvent, due, step_events, time_events
from sailor_tasks.errors import PREEMPTED_EXIT_CODE
from sailor_tasks.model import Placement, to_dict
from sailor_tasks.runtime.contract import contract_env, write_notice
from sailor_tasks.runtime.die_with_agent import libc, set_parent_death_signal
from sailor_tasks.settings import Settings
from sailor_tasks.train.config import TrainConfig
from sailor_tasks.train.progress import read_progress

POLL_S = 0.02
"""How often the injector reads the trainer's progress file (a step of tiny_gpt takes ~10 ms+)."""
WORKER_LIST_S = 0.25
"""How often the injector lists torchrun's workers (to stop injecting once one has exited)."""
_STOPPED: dict[str, bool] = {}
"""Run keys whose launches this process stopped (``stop_launching``) → whether for good (the
run cancelled) or only with its task."""
LOG_TAIL_LINES = 40
"""Lines of the process group's output kept for the error of a failed attempt (and launch.json)."""

RUN_KEY_ENV = "SAILOR_LOCAL_RUN_KEY"
"""Set in the environment of torchrun and so of every process it starts: ``cancel`` finds a run's
processes by it, even those that outlived their parent (torchrun starts workers in sessions of their
own, so neither a process group nor the process tree is enough)."""

STATE_DIR_ENV = "SAILOR_LOCAL_STATE_DIR"
"""Set next to ``RUN_KEY_ENV``: the state folder of the deployment that started the run, so that two
deployments on one machine (two state folders, equal run ids) never stop each other's processes."""

RUN_FOLDER_ENV = "SAILOR_LOCAL_RUN_FOLDER"
"""Set next to ``RUN_KEY_ENV``: the run folder of the launch (where its train config lies), where
``cancel`` writes its marker; a run's own command line need not name the config."""

CANCEL_GRACE_S = 3.0
"""Seconds ``cancel`` gives the workers after SIGTERM (they save a checkpoint, as on a preemption
notice) before it kills what is left: within the 5 s Airflow's task supervisor waits after SIGTERM
before it kills the task (and with it on_kill)."""

logger = logging.getLogger(__name__)


class LocalBackend:
    name = "local"
    detached_attempts = False

    def __init__(self, settings: Settings):
        self.settings = settings

    def _record_path(self, run_key: str) -> str:
        return os.path.join(self.settings.clusters_dir, f"{run_key}.json")

    def provision(self, run_key: str, placement: Placement) -> dict[str, Any]:
        path = self._record_path(run_key)
        if os.path.exists(path):
            with open(path) as f:
                record = json.load(f)
            if record.get("placement", {}).get("zone") == placement.zone:
                logger.info("local cluster %s already provisioned in %s; reusing it", run_key, placement.zone)
                return record
        record = {
            "run_key": run_key,
            "backend": self.name,
            "status": "ready",
            "workers": placement.num_gpus,
            "placement": to_dict(placement),
            "created_at": time.time(),
        }
        os.makedirs(self.settings.clusters_dir, exist_ok=True)
        tmp = f"{path}.tmp"
        with open(tmp, "w") as f:
            json.dump(record, f, indent=2)
        os.replace(tmp, path)
        logger.info(
            "provisioned local cluster %s: %d workers standing in for %dx %s %s in %s",
            run_key,
            placement.num_gpus,
            placement.num_gpus,
            placement.gpu_type,
            placement.market,
            placement.zone,
        )
        return record

    def command(self, launch: TrainLaunch, config: TrainConfig | None = None) -> list[str]:
        """torchrun's argv: the run's own command (confined to ``Settings.command_roots``, checked
        again here as the file may have changed since validation) or the built-in trainer, each
        worker started through ``runtime.die_with_agent`` (it dies with torchrun).

        Raises:
            InvalidRequestError: the run's command is not (or no longer) allowed.
        """
        config = config or _read_config(launch.config_uri)
        if config.command:
            own = resolve_local_command(config.command, self.settings.command_roots)
            # The worker runs in the allowed folder its program lies in (``LocalCommand.root``);
            # torchrun and die_with_agent start in the task's, so that no file of that folder
            # shadows their own modules.
            worker = ["--cwd", own.root, "--", *own.argv()]
        else:
            worker = [sys.executable, "-u", "-m", "sailor_tasks.train", "--config", launch.config_uri]
        # Each worker starts through die_with_agent: it dies with torchrun (a SIGKILLed agent
        # leaves no worker training on, as they run in sessions of their own).
        return [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc-per-node={launch.num_workers}",
            "--no-python",
            sys.executable,
            "-m",
            "sailor_tasks.runtime.die_with_agent",
            *worker,
        ]

    def environment(self, launch: TrainLaunch, config: TrainConfig) -> dict[str, str]:
        """The workers' environment: this process's, less torchrun's ``PET_*`` options and what
        only Airflow and SAILOR's services read (``WORKER_ENV_WITHHELD``: their configuration,
        connections and secrets, the ledger's URL), then the run's ``env``, then the run
        contract's."""
        return {
            **{k: v for k, v in os.environ.items() if not _withheld(k)},
            "OMP_NUM_THREADS": "1",
            "PYTHONUNBUFFERED": "1",
            **config.env,
            **contract_env(
                run_id=config.run_id,
                attempt=config.attempt,
                data_dir=config.data_uri,
                checkpoint_dir=config.checkpoint_uri,
                total_steps=config.total_steps,
                seed=config.seed,
                notice_file=self._notice_path(launch.run_key),
                progress_file=self._progress_path(launch.run_key),
            ),
            RUN_KEY_ENV: launch.run_key,
            STATE_DIR_ENV: os.path.realpath(self.settings.state_dir),
            RUN_FOLDER_ENV: launch.run_folder,
        }

    def _notice_path(self, run_key: str) -> str:
        return os.path.join(self.settings.clusters_dir, f"{run_key}.notice.json")

    def _progress_path(self, run_key: str) -> str:
        return os.path.join(self.settings.clusters_dir, f"{run_key}.progress.json")

    def _injection_path(self, run_key: str) -> str:
        return os.path.join(self.settings.clusters_dir, f"{run_key}.injection.json")

    def train(self, launch: TrainLaunch) -> int:
        """Run torchrun to its end, injecting the launch's preemptions; write ``launch.json``.

        Returns torchrun's exit status: 0 when the workers finished (even after a notice), else
        ``PREEMPTED_EXIT_CODE`` when a preemption was injected. The report keeps torchrun's status
        (``rc``), each failed worker's own (``worker_exit_codes``, from torchrun's failure summary),
        the trainer's (``exit_code``, see ``trainer_exit_code``) and the output's last lines
        (``log_tail``).
        """
        config = _read_config(launch.config_uri)
        cmd = self.command(launch, config)
        os.makedirs(self.settings.clusters_dir, exist_ok=True)
        progress_path = self._progress_path(launch.run_key)
        run_folder = launch.run_folder
        # A try killed too hard to stop its workers (SIGKILL: no on_kill) left its torchrun and
        # workers training in sessions of their own: they must not run (hold the GPUs, write the
        # progress file) next to this launch. Its attempt already ended; stopped before the marker
        # below is cleared, as the stop writes one.
        if leftover := self.cancel(launch.run_key, grace_s=0.0):
            logger.warning(
                "run %s: stopped %d process(es) an earlier try left running", launch.run_key, leftover
            )
        cancelled_uri = paths.cancelled_uri(run_folder)
        storage.remove(cancelled_uri)  # a cancel of an earlier launch of this run folder
        notice_path = self._notice_path(launch.run_key)
        for stale in (progress_path, notice_path):  # an earlier attempt's
            if os.path.exists(stale):
                os.remove(stale)
        env = self.environment(launch, config)
        spec = InjectionSpec.from_dict(launch.inject)
        injection = self._load_injection(launch.run_key)
        started = time.time()
        logger.info("launching: %s", " ".join(cmd))
        # A session of its own: signals meant for the task's process group (a terminal's Ctrl-C, a
        # supervisor's kill) do not reach torchrun behind SAILOR's back; ``cancel`` stops the run
        # in order (workers first, so they can save), here on any exception and from on_kill. A
        # task killed too hard for that (SIGKILL, an OOM kill) takes torchrun with it all the
        # same (``_die_with_task``): left running, it would train beside the retry's launch, on
        # another worker's host unseen by the next try's check above.
        if sys.platform.startswith("linux"):
            libc()  # loaded here, so that torchrun's preexec_fn only calls prctl
        proc = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            encoding="utf-8",
            errors="backslashreplace",  # any bytes a worker prints: one bad byte must not stop the reader
            env=env,
            start_new_session=True,
            preexec_fn=functools.partial(_die_with_task, os.getpid()),
        )
        failures = FailureSummary()
        reader = threading.Thread(target=self._stream, args=(proc, failures), daemon=True)
        reader.start()
        event = preempted_at = None
        try:
            if launch.run_key in _STOPPED:  # its task was killed before (or while) it started
                self.cancel(launch.run_key, grace_s=0.0, for_good=_STOPPED[launch.run_key])
            elif not spec.empty:
                events = step_events(spec) + time_events(
                    spec, launch.attempt, started - injection["run_started"]
                )
                event = self._watch(proc, events, injection, progress_path)
                if event is not None:
                    injection["fired"].append(event.key)
                    self._save_injection(launch.run_key, injection)
                    preempted_at = self._deliver(proc, event, spec.notice_s, notice_path)
            rc = proc.wait()
        except BaseException:  # interrupted (Ctrl-C, the task killed): the workers die with us
            self.cancel(launch.run_key, grace_s=0.0)
            raise
        reader.join(timeout=10)
        if event is not None:
            logger.warning(
                "preempted (%s, %s notice): torchrun's ChildFailedError above is the workers' exit "
                "status 75 (checkpointed and stopped) or the kill; the train stage recovers",
                event.key,
                "with" if event.noticed else "without",
            )
        progress = read_progress(progress_path)
        stop = _stop_marker(cancelled_uri)
        report = {
            "attempt": launch.attempt,
            "rc": rc,
            "cancelled": stop is not None and stop.get("for_good", True),
            "interrupted": stop is not None and not stop.get("for_good", True),
            "exit_code": trainer_exit_code(rc, failures),
            "worker_exit_codes": {str(rank): code for rank, code in sorted(failures.exit_codes.items())},
            "started_at": started,
            "ended_at": time.time(),
            "first_step_at": progress.get("first_step_at"),
            "resumed_from": progress.get("resumed_from"),
            "step": progress.get("step"),
            "checkpoint_step": progress.get("checkpoint_step"),
            "preemption": None
            if event is None
            else {
                "key": event.key,
                "noticed": event.noticed,
                "at": preempted_at,
                "zone": launch.placement.zone,
            },
            "log_tail": failures.log_tail(),
        }
        storage.write_json(paths.launch_report_uri(run_folder), report)
        return PREEMPTED_EXIT_CODE if event is not None and rc != 0 else rc

    @staticmethod
    def _stream(proc: subprocess.Popen, failures: FailureSummary) -> None:
        """Stream torchrun's output into the task log as it happens, reading its failure summary."""
        for line in proc.stdout or ():
            logger.info("%s", line.rstrip())
            failures.feed(line)

    def _load_injection(self, run_key: str) -> dict[str, Any]:
        path = self._injection_path(run_key)
        if os.path.exists(path):
            with open(path) as f:
                return json.load(f)
        state = {"run_started": time.time(), "fired": []}
        self._save_injection(run_key, state)
        return state

    def _save_injection(self, run_key: str, state: dict[str, Any]) -> None:
        path = self._injection_path(run_key)
        with open(f"{path}.tmp", "w") as f:
            json.dump(state, f)
        os.replace(f"{path}.tmp", path)

    @staticmethod
    def _watch(
        proc: subprocess.Popen, events: list[PreemptionEvent], injection: dict[str, Any], progress_path: str
    ) -> PreemptionEvent | None:
        """Poll the trainer's progress until an event is due (returned) or training ends (None).

        Training ends as soon as one worker (a child of torchrun) has exited: the workers finished,
        or one failed and torchrun is stopping the others (it waits up to 30 s for them). An event
        due then would turn a completed run, or a crash, into a preemption: none fires."""
        import psutil

        fired = set(injection["fired"])
        try:
            agent = psutil.Process(proc.pid)
        except psutil.NoSuchProcess:
            return None
        workers: dict[int, psutil.Process] = {}
        listed = 0.0
        while proc.poll() is None:
            if time.monotonic() - listed >= WORKER_LIST_S:  # a scan of every process: not each poll
                with contextlib.suppress(psutil.NoSuchProcess):
                    workers.update((w.pid, w) for w in agent.children())
                listed = time.monotonic()
            if any(_exited(w) for w in workers.values()):
                logger.info("a worker exited: training is ending, no preemption is injected")
                return None
            step = read_progress(progress_path).get("step")
            event = due(events, fired, step, time.time() - injection["run_started"])
            if event is not None:
                return event
            time.sleep(POLL_S)
        return None

    @staticmethod
    def _deliver(proc: subprocess.Popen, event: PreemptionEvent, notice_s: float, notice_path: str) -> float:
        """Preempt the process group: the notice file (the deadline), SIGTERM to the workers, then
        SIGKILL after the notice window; or SIGKILL at once (no notice). Returns the time the
        capacity was lost (epoch seconds)."""
        import psutil

        try:
            agent = psutil.Process(proc.pid)
            workers = agent.children(recursive=True)
        except psutil.NoSuchProcess:
            return time.time()
        if event.noticed:
            write_notice(notice_path, notice_s)  # before the signal: a worker reads it on SIGTERM
            # torchrun starts workers in their own sessions, so a group signal would miss them: the
            # notice goes to each worker. Workers finish their step, checkpoint and exit 75; the
            # agent sees them exit and stops. The agent itself is not signalled while workers run:
            # on SIGTERM it tears the job down (and with it the store the workers rendezvoused on),
            # which can kill a checkpoint half-written (seen here). Before any worker exists, the
            # agent is the one to tell, and it stops.
            logger.warning(
                "injecting preemption %s: SIGTERM to %d workers, %.0f s notice",
                event.key,
                len(workers),
                notice_s,
            )
            for p in workers or [agent]:
                _signal(p, signal.SIGTERM)
            deadline = time.monotonic() + notice_s
            try:
                proc.wait(timeout=notice_s)
                # torchrun saw its workers exit; what they started may still be saving (a wrapper
                # script that did not ``exec`` the trainer exits at once on SIGTERM and leaves it
                # behind): the notice window holds for every process signalled.
                _wait_gone(workers, deadline - time.monotonic())
                if not _still_running(workers):
                    return time.time()
            except subprocess.TimeoutExpired:
                pass
            logger.warning("notice window of %.0f s over: killing the process group", notice_s)
        else:
            logger.warning("injecting preemption %s: SIGKILL without notice", event.key)
        with contextlib.suppress(psutil.NoSuchProcess):
            workers = list({*workers, *agent.children(recursive=True)})  # any started meanwhile
        for p in [agent, *workers]:
            _signal(p, signal.SIGKILL)
        return time.time()

    def cancel(self, run_key: str, grace_s: float = CANCEL_GRACE_S, *, for_good: bool = True) -> int:
        """Stop every process of the run: SIGTERM to the workers (they checkpoint and exit, as on a
        preemption notice), then, after ``grace_s`` or at once when 0, SIGKILL to whatever of the
        run is left, torchrun included, until none is. A process of the run is one started with the
        run's key in its environment, or any descendant of one (a helper the training code started
        with an environment of its own), or one already seen: a process that is exiting no longer
        shows its environment. Returns how many processes were stopped.

        The launch's report then says ``cancelled`` (the run was stopped for good) or, with
        ``for_good`` False, ``interrupted`` (only its task was stopped: the next try resumes it);
        a cancel is never turned back into an interruption."""
        procs = run_processes(run_key, self.settings.state_dir)
        if not procs:
            return 0
        seen: dict[int, Any] = {}
        _with_descendants(procs, seen)  # before any signal: a helper outlives its parent's exit
        for run_folder in {_run_folder(p) for p in procs} - {None}:  # before any signal: train reads it
            uri = paths.cancelled_uri(run_folder)
            if for_good or _stop_marker(uri) is None:
                storage.write_json(uri, {"at": time.time(), "for_good": for_good})
        stopped = {p.pid for p in procs}
        if grace_s > 0:
            workers = [p for p in procs if "torch.distributed.run" not in " ".join(_cmdline(p))]
            logger.warning(
                "cancelling run %s: SIGTERM to %d worker(s), %.0f s to save", run_key, len(workers), grace_s
            )
            for p in workers or procs:
                _signal(p, signal.SIGTERM)
            _wait_gone(procs, grace_s)
        for _ in range(20):  # SIGKILL what is left, and anything started meanwhile
            left = _still_running(_with_descendants(run_processes(run_key, self.settings.state_dir), seen))
            if not left:
                break
            logger.warning("cancelling run %s: SIGKILL to %d process(es)", run_key, len(left))
            for p in left:
                _signal(p, signal.SIGKILL)
            _wait_gone(left, 5.0)
            stopped |= {p.pid for p in left}
        else:
            raise RuntimeError(f"run {run_key}: processes still running after cancel: {left}")
        logger.warning("cancelled run %s: %d process(es) stopped", run_key, len(stopped))
        return len(stopped)

    def teardown(self, run_key: str) -> bool:
        for extra in (self._progress_path(run_key), self._injection_path(run_key), self._notice_path(run_key)):
            if os.path.exists(extra):
                os.remove(extra)
        path = self._record_path(run_key)
        if not os.path.exists(path):
            return False
        os.remove(path)
        logger.info("tore down local cluster %s", run_key)
        return True


def _read_config(config_uri: str) -> TrainConfig:
    return TrainConfig.from_json(storage.read_bytes(config_uri).decode())


# torchrun's failure summary (ChildFailedError) lists each failed worker as "rank : N (local_rank:
# N)" then "exitcode : CODE (pid: ...)", the first observed failure under "Root Cause": the workers'
# own exit statuses, which torchrun's own (1) hides.
_SUMMARY_ROOT_CAUSE = re.compile(r"^\s*Root Cause\b")
_SUMMARY_RANK = re.compile(r"^\s*rank\s*:\s*(\d+)\b")
_SUMMARY_EXITCODE = re.compile(r"^\s*exitcode\s*:\s*(-?\d+)\b")
_AGENT_REPORT = re.compile(r"^[EW]\d{4} .*\bfailed \(exitcode: -?\d+\)")
"""torchrun's first line about a failed worker: from here on the output is torchrun's own report."""


@dataclass
class FailureSummary:
    """The workers' exit statuses from torchrun's failure summary (empty when it printed none)."""

    exit_codes: dict[int, int] = field(default_factory=dict)
    """rank → exit status of each failed worker."""
    root_cause_rank: int | None = None
    """The first worker torchrun saw fail; it then stops the others (SIGTERM: exit status -15)."""
    workers_tail: collections.deque[str] = field(
        default_factory=lambda: collections.deque(maxlen=LOG_TAIL_LINES), repr=False
    )
    """The workers' last lines before torchrun's own failure report."""
    _rank: int | None = field(default=None, repr=False)
    _in_root_cause: bool = field(default=False, repr=False)
    _agent_reporting: bool = field(default=False, repr=False)

    def feed(self, line: str) -> None:
        """Read one line of torchrun's output."""
        if not self._agent_reporting:
            if _AGENT_REPORT.match(line):
                self._agent_reporting = True
            else:
                self.workers_tail.append(line.rstrip())
        if _SUMMARY_ROOT_CAUSE.match(line):
            self._in_root_cause = True
        elif m := _SUMMARY_RANK.match(line):
            self._rank = int(m.group(1))
            if self._in_root_cause:
                self.root_cause_rank, self._in_root_cause = self._rank, False
        elif (m := _SUMMARY_EXITCODE.match(line)) and self._rank is not None:
            self.exit_codes[self._rank], self._rank = int(m.group(1)), None


    def log_tail(self) -> list[str]:
        """The workers' last lines, then each failed worker's exit status (torchrun's report)."""
        codes = ", ".join(f"rank {r}: {c}" for r, c in sorted(self.exit_codes.items()))
        return [*self.workers_tail, *([f"[torchrun] worker exit status: {codes}"] if codes else [])]


WORKER_ENV_WITHHELD = ("PET_", "AIRFLOW__", "AIRFLOW_CONN_", "AIRFLOW_VAR_", "SAILOR_LEDGER_URL")
"""Prefixes of the task's environment variables the training workers do not get: torchrun's
options (``PET_*``: they would restart or silence the workers behind SAILOR's back), Airflow's
configuration, connections and variables (the metadata database's URL and password, the API's
signing secret), and the ledger's URL (its password). A run that needs one of Airflow's names it
in ``env`` (``SAILOR_*`` and ``PET_*`` are reserved there)."""


def _withheld(name: str) -> bool:
    return name.startswith(WORKER_ENV_WITHHELD)


def trainer_exit_code(rc: int, failures: FailureSummary) -> int | None:
    """The trainer's own exit status: 0 when torchrun succeeded, else the exit status of the first
    worker torchrun saw fail (75: it checkpointed and stopped on a notice); None when torchrun was
    killed before it could summarise (a preemption without notice, or a notice window overrun)."""
    if rc == 0:
        return 0
    return failures.exit_codes.get(failures.root_cause_rank) if failures.root_cause_rank is not None else None


def _die_with_task(task_pid: int) -> None:
    """In torchrun's process, before it starts: SIGTERM (torchrun's stop: its workers save on it
    as on a notice, then exit, and die with it) when the thread that started it exits, the task
    killed included; exit at once if the task is gone already."""
    if set_parent_death_signal(signal.SIGTERM) and os.getppid() != task_pid:
        os._exit(1)


def run_processes(run_key: str, state_dir: str | None = None) -> list[Any]:
    """Live processes (zombies excluded) started for ``run_key`` by the local backend (of the
    deployment whose state folder is ``state_dir``, when given)."""
    import psutil

    state = os.path.realpath(state_dir) if state_dir is not None else None

    found = []
    for p in psutil.process_iter():
        if p.pid == os.getpid():
            continue
        try:
            env = p.environ()
            if (
                env.get(RUN_KEY_ENV) == run_key
                and (state is None or env.get(STATE_DIR_ENV) == state)
                and p.status() != psutil.STATUS_ZOMBIE
            ):
                found.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def _with_descendants(procs: list[Any], seen: dict[int, Any]) -> list[Any]:
    """``procs``, every process in ``seen``, and every descendant of theirs (the calling process
    and its ancestors left out); ``seen`` gets them all."""
    import psutil

    for p in [*procs, *seen.values()]:
        seen.setdefault(p.pid, p)
        with contextlib.suppress(psutil.Error):
            for child in p.children(recursive=True):
                seen.setdefault(child.pid, child)
    mine = {os.getpid(), *(a.pid for a in psutil.Process().parents())}
    return [p for pid, p in seen.items() if pid not in mine]


def _still_running(procs: list[Any]) -> list[Any]:
    """The processes that still run: neither gone (nor their pid reused) nor zombies."""
    import psutil

    left = []
    for p in procs:
        with contextlib.suppress(psutil.Error):
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                left.append(p)
    return left


def _run_folder(p: Any) -> str | None:
    """The run folder of the launch a process of the run belongs to (``RUN_FOLDER_ENV``), if any."""
    import psutil

    try:
        return p.environ().get(RUN_FOLDER_ENV) or None
    except psutil.Error:
        return None


def _cmdline(p: Any) -> list[str]:
    import psutil

    try:
        return p.cmdline()
    except psutil.Error:
        return []


def _wait_gone(procs: list[Any], timeout_s: float) -> None:
    """Wait until every process has exited (a zombie counts: it runs no more) or the time is up.
    Polls instead of ``psutil.wait_procs``, which would reap torchrun from under ``Popen.wait``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not _still_running(procs):
            return
        time.sleep(0.05)


def stop_launching(run_key: str, for_good: bool = True) -> None:
    """This process (a train task being killed) starts no training of the run from now on:
    ``train`` stops at once what it starts (``cancel``, ``for_good`` or not). The task's
    ``on_kill`` runs, then the task goes on until the supervisor's SIGKILL; killed before its
    launch, it would otherwise start torchrun, in a session of its own, after the stop, with
    nothing left to stop it."""
    _STOPPED[run_key] = _STOPPED.get(run_key, False) or for_good


def _stop_marker(uri: str) -> dict[str, Any] | None:
    """The marker ``cancel`` wrote in a run folder, or None (none, or unreadable: it is written
    whole, so only a foreign file could be)."""
    try:
        marker = storage.read_json(uri)
    except FileNotFoundError:
        return None
    except ValueError:
        return {"for_good": True}
    return marker if isinstance(marker, dict) else {"for_good": True}


def _exited(process: Any) -> bool:
    """The psutil process has exited (gone, or a zombie its parent has not reaped yet)."""
    import psutil

    try:
        return not process.is_running() or process.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _signal(p: Any, sig: int) -> None:
    import psutil

    try:
        p.send_signal(sig)
    except psutil.NoSuchProcess:
        pass
