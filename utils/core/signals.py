"""Stopping cleanly when told to, and taking no engine down with the stage that dies.

- `sigterm_as_interrupt`: in the block, SIGTERM (`kill PID`, a scheduler's pre-emption) raises
  `Terminated`, a KeyboardInterrupt, in the main thread, as SIGINT raises KeyboardInterrupt. A stage then unwinds as it does on Ctrl-C:
  its manifest says "failed", its run lock is released, and vLLM's engine core is shut down by
  vLLM's own finaliser when the interpreter exits. Without it Python dies on the spot and the
  engine core (a separate process, several GB) keeps running.
- `die_with_parent`: a process that multiprocessing *spawns* from a stage (vLLM's engine core on
  CPU is spawned, not forked) asks the kernel for SIGTERM when its parent dies (Linux
  PR_SET_PDEATHSIG), so a stage killed with SIGKILL, or by the OOM killer, leaves no engine behind.
  vLLM's engine core shuts down on SIGTERM, and its workers follow it through their death pipes.
- `stop_with`: a stage whose driver is not its parent (a Ray task's stage: its parent is the Ray
  worker, which can outlive a killed driver) watches the driver's process and stops as on SIGTERM
  when it is gone, so that no stage outlives its driver holding the run.
- `stop_child`: a child process asked to stop (SIGTERM), given time to unwind, then killed.
- `run_child` starts a stage as a new interpreter; `run_forked` forks it from the caller instead,
  so that modules the caller imported already (torch, transformers, vLLM: ~19 s a stage on a
  2-core box) are not imported again. Both stop the child the same way and tell it our pid.

tests/test_signals.py runs each against a real stage with a real vLLM engine.
"""
from __future__ import annotations

import atexit
import contextlib
import os
import runpy
import signal
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path

TERMINATED_EXIT = 128 + signal.SIGTERM  # the shell's code for "ended by SIGTERM"
PR_SET_PDEATHSIG = 1  # linux/prctl.h


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the main thread is, so that every `finally` and `with` runs."""


_received: list[str] = []  # the signals `sigterm_as_interrupt` turned into exceptions, in order


def as_received(exc: KeyboardInterrupt) -> KeyboardInterrupt:
    """`exc` as the signal that raised it: `Terminated` where a SIGTERM was turned into it and a
    library on the way up replaced it with a plain KeyboardInterrupt (Ray's `ray.wait` does)."""
    if not isinstance(exc, Terminated) and _received[-1:] == ["SIGTERM"]:
        return Terminated("received SIGTERM")
    return exc


def stop_word(exc: KeyboardInterrupt) -> str:
    """How a run stopped by `exc` says so: 'terminated' (SIGTERM, as `Terminated`) or 'interrupted' (Ctrl-C)."""
    return "terminated" if isinstance(exc, Terminated) else "interrupted"


@contextlib.contextmanager
def sigterm_as_interrupt():
    """In the block, the first SIGINT raises KeyboardInterrupt and the first SIGTERM `Terminated`;
    any later one is ignored with a note, so that a second signal (a driver passing SIGTERM on to a
    stage that Ctrl-C already reached) cannot cut the unwinding short. SIGKILL still forces, and
    `die_with_parent` then stops the engine. Main thread only; elsewhere a no-op."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    stopping = []

    def _raise(signum, frame):  # noqa: ARG001 - the signal module's signature
        name = signal.Signals(signum).name
        if stopping:
            print(f"{name} ignored: already stopping after {stopping[0]} (SIGKILL forces)", file=sys.stderr)
            return
        stopping.append(name)
        _received.append(name)
        raise Terminated(f"received {name}") if signum == signal.SIGTERM else KeyboardInterrupt

    previous = {sig: signal.signal(sig, _raise) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def is_spawned_child() -> bool:
    """Whether this interpreter was started by multiprocessing's spawn (it re-imports the parent's
    main module, which is how a stage's modules come to run in vLLM's engine core). `sys.argv` is
    the parent's by then; `sys.orig_argv` is this interpreter's own command line."""
    return "--multiprocessing-fork" in sys.orig_argv


def die_with_parent(sig: int = signal.SIGTERM) -> bool:
    """Ask the kernel to send `sig` to this process when its parent dies; exit at once if the
    parent is already gone. False where unsupported (not Linux)."""
    if not sys.platform.startswith("linux"):
        return False
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
        return False
    if os.getppid() == 1:  # orphaned before the request took effect: the parent will never die again
        os._exit(TERMINATED_EXIT)
    return True


def exit_when_orphaned(grace: float = 60.0, poll: float = 1.0) -> threading.Thread:
    """The last resort after `die_with_parent`'s signal: a daemon thread that ends this process with
    os._exit once its parent has been gone `grace` seconds. vLLM's engine core handles that SIGTERM
    with a shutdown that can hang (a full suite saw one, in futex waits with its worker blocked on a
    pipe, alive 15 minutes after its stage was SIGKILLed)."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:  # a process is re-parented once, never back
            time.sleep(poll)
        time.sleep(grace)
        os._exit(TERMINATED_EXIT)

    thread = threading.Thread(target=watch, daemon=True, name="orphan-watch")
    thread.start()
    return thread


def stop_child(proc: subprocess.Popen, grace: float = 60.0) -> int:
    """SIGTERM `proc` (if it still runs), wait up to `grace` seconds, then SIGKILL; its exit code.
    A child already unwinding from a Ctrl-C ignores the SIGTERM (`sigterm_as_interrupt`)."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            return proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            proc.kill()
    return proc.wait()


DRIVER_ENV = "REDCODA_DRIVER"  # "<host>:<pid>:<start>": the driver a Ray task's stage stops with (`stop_with`)


def process_tag(pid: int | None = None) -> str:
    """`<host>:<pid>:<start>` for a process of this machine, its start time in clock ticks since boot
    (/proc/<pid>/stat field 22), so a pid the kernel hands to another process later is told apart."""
    import socket

    pid = pid or os.getpid()
    return f"{socket.gethostname()}:{pid}:{_start_ticks(pid)}"


def _start_ticks(pid: int) -> str | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]  # the fields after the command's name start at field 3


def stop_with(tag: str, interval: float = 1.0, grace: float = 120.0) -> bool:
    """Watch the process `tag` names (`process_tag`) from a daemon thread; once it is gone, SIGTERM
    this process (it unwinds as on `kill`: manifest "failed", lock released, engine down), and
    SIGKILL it if it still runs `grace` seconds later. False, and nothing watched, when `tag` is
    malformed or names another machine (a Ray cluster's driver) or a process that cannot be read."""
    import socket

    host, _, rest = tag.partition(":")
    pid, _, start = rest.partition(":")
    if host != socket.gethostname() or not pid.isdigit() or not start or _start_ticks(int(pid)) != start:
        return False

    def watch():
        while _start_ticks(int(pid)) == start:
            time.sleep(interval)
        print(f"the driver (pid {pid}) is gone: stopping", file=sys.stderr)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(grace)
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="stop-with-driver", daemon=True).start()
    return True


PARENT_ENV = "REDCODA_PARENT"  # set by run_child: the child stops with this pid (utils/core/stages.run_main)


def run_child(cmd: list[str], cwd, stdout=None, console_log: Path | None = None) -> int:
    """`subprocess.call`, except that an interrupted or terminated caller stops the child with
    `stop_child` (SIGTERM first, so that it can unwind) instead of SIGKILLing it, and that the
    child is told our pid (`PARENT_ENV`) so that it stops with us if we are killed outright. With
    `stdout` (an open file), the child's stdout and stderr go there; else with `console_log` they
    reach our console through the quiet-console filter, which keeps all of it in that file."""
    env = {**os.environ, PARENT_ENV: str(os.getpid())}
    if stdout is not None or console_log is None:
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=stdout, stderr=subprocess.STDOUT if stdout else None)
        return _wait_or_stop(proc)
    with _console_filter(console_log, cwd) as (out, err):
        proc = subprocess.Popen(cmd, cwd=cwd, env={**env, "PYTHONUNBUFFERED": "1"}, stdout=out, stderr=err)
        os.close(out)
        os.close(err)
        return _wait_or_stop(proc)


@contextlib.contextmanager
def _console_filter(log: Path, cwd):
    """Two pipe write ends (for a child's stdout and stderr) whose other ends the filter process
    (utils/core/console.py) reads, writing everything to `log` and the console's share to ours. The
    caller closes its copies of the write ends once the child has them; on leaving, the filter is
    waited for (it ends when the child and anything it started have closed their ends)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    filt = subprocess.Popen([sys.executable, "-m", "utils.core.console", str(log), str(err_r)], cwd=cwd,
                            stdin=out_r, pass_fds=(err_r,))
    os.close(out_r)
    os.close(err_r)
    try:
        yield out_w, err_w
    finally:
        for fd in (out_w, err_w):  # already closed by a caller that got as far as starting the child
            with contextlib.suppress(OSError):
                os.close(fd)
        try:
            filt.wait(timeout=FILTER_GRACE)
        except subprocess.TimeoutExpired:  # a grandchild still holds a pipe open: stop waiting for it
            filt.kill()
            filt.wait()


FILTER_GRACE = 30.0  # seconds the console filter may take after its stage ended


def _wait_or_stop(proc) -> int:
    """The child's exit code; if we are interrupted or terminated while waiting, stop it first. The
    wait polls, so that an exception another thread raises in ours (Ray's `ray.cancel` of the task
    that runs this) lands within a second; a blocking wait would hold it until the child ended."""
    try:
        while True:
            with contextlib.suppress(subprocess.TimeoutExpired):
                return proc.wait(timeout=1.0)
    except BaseException:
        stop_child(proc)
        raise


class Forked:
    """A forked child with the part of `subprocess.Popen` that `stop_child` and the driver use."""

    def __init__(self, pid: int):
        self.pid, self.returncode = pid, None

    def poll(self) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)  # -N: ended by signal N, as Popen
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if timeout is None:
            while self.returncode is None:
                _, status = os.waitpid(self.pid, 0)
                self.returncode = os.waitstatus_to_exitcode(status)
            return self.returncode
        deadline = time.monotonic() + timeout
        while self.poll() is None:
            if time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(str(self.pid), timeout)
            time.sleep(0.05)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def run_forked(script: str, args: list[str], cwd, stdout=None, console_log: Path | None = None) -> int:
    """`run_child([sys.executable, script, *args], cwd, stdout, console_log)`, with the child forked
    from this process: it runs `script` as `__main__` with `args`, on the modules we have imported.
    A caller running Python threads besides its main one (`single_threaded`) gets `run_child` instead.

    The child never returns into our stack (it would run our `finally` blocks, e.g. a driver's lock
    release): it ends with `os._exit` after running the exit handlers, as an interpreter would."""
    if not single_threaded():
        return run_child([sys.executable, script, *args], cwd, stdout, console_log)
    if stdout is not None or console_log is None:
        return _fork(script, args, cwd, (stdout.fileno(), stdout.fileno()) if stdout is not None else None)
    with _console_filter(console_log, cwd) as (out, err):
        return _fork(script, args, cwd, (out, err), close=(out, err))


def _fork(script: str, args: list[str], cwd, fds: tuple[int, int] | None, close=()) -> int:
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the child
        os._exit(_forked_main(script, args, cwd, fds))
    for fd in close:
        os.close(fd)
    return _wait_or_stop(Forked(pid))


def exit_without_teardown(fn) -> None:
    """Run `fn` as a process's main; when it returns, exit with its code after the exit handlers,
    skipping the interpreter's teardown, as a forked stage child ends: at teardown Triton's
    nanobind bindings (imported with vLLM 0.32) print about thirty lines of "leaked" objects,
    nothing this process did. Open files are closed by the exit handlers and the callers' own
    `with` blocks first. An exception or `sys.exit` inside `fn` (`--help`, a usage error) leaves as
    usual, so that a caller running the script in its own interpreter (runpy) gets it back."""
    code = fn() or 0
    try:
        atexit._run_exitfuncs()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def single_threaded() -> bool:
    """Whether this process runs no Python thread but the main one. A fork copies only the calling
    thread, so a lock another thread held stays held in the child. The idle native helper threads
    that `import torch` and vLLM's imports start (one each, parked on a futex) are tolerated, as
    torch's own DataLoader forks its workers beside them; a process that starts threads of its
    own (a Ray worker, a thread pool) is not forked from."""
    return threading.active_count() == 1


def _name_process(name: str) -> None:
    """Call this process `name` in `top` and `ps -o comm` (Linux PR_SET_NAME: 15 bytes); its command
    line stays the parent's."""
    if sys.platform.startswith("linux"):
        import ctypes

        pr_set_name = 15  # linux/prctl.h
        ctypes.CDLL(None).prctl(pr_set_name, name.encode()[:15], 0, 0, 0)


def _forked_main(script: str, args: list[str], cwd, fds: tuple[int, int] | None) -> int:
    code = 1
    try:
        _name_process(os.path.basename(script).removesuffix(".py"))
        os.environ[PARENT_ENV] = str(os.getppid())
        if fds is not None:  # (stdout, stderr) file descriptors: a file, or the console filter's pipes
            os.dup2(fds[0], 1)
            os.dup2(fds[1], 2)
        # streams on file descriptors 1 and 2, as a new interpreter has (ours may be another object);
        # stdout line by line, as on a terminal, so that a filtered console keeps the stage's pace
        sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115 - lives as long as the child
        sys.stderr = open(2, "w", buffering=1, errors="backslashreplace", closefd=False)  # noqa: SIM115
        os.chdir(cwd)
        sys.argv = [script, *args]
        runpy.run_path(script, run_name="__main__")
        code = 0
    except SystemExit as exc:  # how every stage script ends: sys.exit(run_main(...))
        if exc.code is None or isinstance(exc.code, int):
            code = exc.code or 0
        else:
            print(exc.code, file=sys.stderr)
    except KeyboardInterrupt as exc:  # a signal before the stage's own handlers were in place
        code = TERMINATED_EXIT if isinstance(exc, Terminated) else 130
    except BaseException:  # noqa: BLE001 - the child must reach os._exit whatever happens
        traceback.print_exc()
    try:
        atexit._run_exitfuncs()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
    return code
