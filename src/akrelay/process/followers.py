"""The log followers' own process: the search indexer and the KIP importer of one data directory.

Why a process: inside a Granian worker the followers share the GIL with the
event loop that accepts events, and on a small machine they take the CPU that
acceptance needs during a burst. ``akrelay serve`` (``--followers process``,
the default) therefore runs them here, one process per data directory, started
beside Granian (before it on a first start) and stopped after it, at the lowest CPU
priority once started, or from its start on a restart (Linux ``SCHED_IDLE``, and
``nice`` + :data:`NICE`; :func:`lower_priority`):
under load the kernel gives the workers the CPU first, and the derived state
catches up as soon as the burst ends. The workers only read the index and the nexus
(``RelayNode(follow=False)``).

The leader locks stay what guarantees one indexer and one importer per data
directory: this process takes them as any node would (a process that cannot
take one, e.g. while an older one is still stopping, retries). If it dies
(killed, crashed) the launcher's :class:`FollowerProcess` starts another after
:data:`RESPAWN_DELAY`; it resumes from the durable positions (the index's
committed position, the nexus head). It exits by itself when the launcher is
gone. Commits happen in the workers, so this process learns of them by polling
the store's checkpoint (search every 50 ms, KIP every 200 ms; with a Redis
store also by pub/sub).
"""

from __future__ import annotations

import logging
import os
import select
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Callable, Mapping

log = logging.getLogger("akrelay.process.followers")

#: Set to ``1`` in the workers' environment when this process keeps their derived state.
FOLLOWER_PROCESS_ENV = "AKRELAY__FOLLOWER_PROCESS"
#: The components whose followers run here (KnowQL and the explorer read them in the workers).
FOLLOWED = ("search", "kip")
#: Niceness added to this process (besides the ``SCHED_IDLE`` class, see :func:`lower_priority`).
NICE = 10
#: Seconds between the death of the process and its replacement (no respawn storm).
RESPAWN_DELAY = 1.0
#: Seconds a stopping process may take before it is killed: the graceful stop of the whole
#: relay stays within about 2 s, and both the index and the nexus are crash-safe (a kill
#: only means redoing the work since their last commit).
STOP_TIMEOUT = 2.0
#: How often the process checks that its launcher is still alive.
PARENT_CHECK = 1.0
#: The launcher waits this long for a new process to have the index and the nexus open
#: before it lets the workers answer (then it goes on: readers answer ``index_lag`` meanwhile).
READY_TIMEOUT = 15.0
#: The environment variable naming the pipe on which the process says it is ready.
READY_FD_ENV = "AKRELAY__FOLLOWERS_READY_FD"
#: What a previous run leaves in the data directory: the search index (``search/<ranking id>``,
#: :func:`akrelay.search.index.index_dir`) and the KIP nexus (:func:`akrelay.kip.nexus_sqlite.nexus_path`).
#: Named here so that the launcher need not import Tantivy or the nexus to look for them.
SEARCH_DIR = "search"
NEXUS_FILE = "kip-nexus.sqlite3"


def derived_state_exists(data_dir: str | os.PathLike[str]) -> bool:
    """Whether the search index and the KIP nexus exist already (a restart, not a first start).

    Then the workers can open and read them while the followers' process starts beside
    them, and the launcher does not wait for it (issue 25); on a first start it waits, so
    that the files exist before the first request.
    """
    data = Path(data_dir)
    search = data / SEARCH_DIR
    return (data / NEXUS_FILE).is_file() and search.is_dir() and any(p.is_dir() for p in search.iterdir())


def main(env: Mapping[str, str] | None = None) -> int:
    """Run the followers until SIGTERM/SIGINT or until the launcher is gone (``python -m akrelay.process.followers``)."""
    from akrelay.node import RelayNode
    from akrelay.settings import from_resolved_env

    logging.basicConfig(level=logging.INFO, format="[%(levelname)s] %(name)s: %(message)s", stream=sys.stderr)
    halt = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: halt.set())
    launcher = os.getppid()
    settings = from_resolved_env(env)
    # On a restart the index and the nexus exist and the workers start beside this process
    # (akrelay.process.launcher.start_followers): yield to them from the first import on, so that their
    # start-up, which is what a client waits for, gets the CPU first (issue 25).
    restart = derived_state_exists(settings.data_dir)
    if restart:
        lower_priority()
    # No trigram indexer or WAL checkpointer of the store here: the workers run them, and at this
    # process's idle priority a thread holding the store's cross-process write lock would be
    # preempted by the very workers that wait for that lock (a priority inversion under load).
    node = RelayNode.open(settings, components=FOLLOWED, store_background=False)
    try:
        # On a first start, at normal priority, so the index and the nexus file exist before the
        # workers' first requests even on a busy machine; yield from then on.
        node.start()
        node.kip.gateway.runtime()  # the nexus file exists (the KIP component opens it in a thread)
        _say_ready(env)
        if not restart:  # on a restart every thread started since inherited the low priority
            lower_priority()
        log.info("followers: pid %d keeps the search index and the KIP nexus of %s current",
                 os.getpid(), settings.data_dir)
        while not halt.wait(PARENT_CHECK):
            if os.getppid() != launcher:
                log.info("followers: the launcher is gone; stopping")
                break
    finally:
        node.stop()
    return 0


def lower_priority(nice: int = NICE) -> None:
    """Make this process yield the CPU to the workers: ``nice`` more, and Linux's ``SCHED_IDLE`` class.

    Both are per thread on Linux, so every thread that exists now gets them (Tantivy's
    writer threads too) and threads started later inherit them. ``SCHED_IDLE`` runs the
    process only when no normal task of the relay wants that CPU, and a waking worker
    preempts it at once; when nothing else of the relay runs it still gets the relay's
    full share (it catches up after a burst). The niceness is what remains where
    ``SCHED_IDLE`` is missing.
    """
    level = min(19, os.getpriority(os.PRIO_PROCESS, 0) + nice)
    idle = getattr(os, "SCHED_IDLE", None)
    done: set[int] = set()
    for _ in range(10):  # again while threads appear (one may start a thread as we go)
        try:
            threads = {int(tid) for tid in os.listdir("/proc/self/task")} - done
        except OSError:  # no /proc: this thread only (threads started later inherit it)
            threads = {0} - done
        if not threads:
            return
        for tid in threads:
            try:
                os.setpriority(os.PRIO_PROCESS, tid, level)
                if idle is not None:
                    os.sched_setscheduler(tid, idle, os.sched_param(0))
            except ProcessLookupError:  # the thread ended meanwhile
                pass
            except OSError as exc:  # the platform refuses: follow at the priority we have
                log.warning("followers: cannot lower the CPU priority (%s)", exc)
                return
        done |= threads


def _say_ready(env: Mapping[str, str] | None) -> None:
    """Tell the launcher (which waits in :meth:`FollowerProcess.start`) that the derived state is open."""
    fd = (os.environ if env is None else env).get(READY_FD_ENV)
    if fd:
        try:
            os.write(int(fd), b"ready\n")
            os.close(int(fd))
        except OSError:  # the launcher stopped waiting: nothing to tell
            pass


class FollowerProcess:
    """The launcher's handle on the followers' process: start it, replace it when it dies, stop it.

    A process that exits with status 0 was asked to stop (a signal to the whole
    process group, e.g. Ctrl-C) and is not replaced; any other end (killed,
    crashed) is, after ``respawn_delay`` seconds.
    """

    def __init__(self, env: Mapping[str, str] | None = None, *, respawn_delay: float = RESPAWN_DELAY,
                 argv: list[str] | None = None) -> None:
        self.env = dict(os.environ if env is None else env)
        self.respawn_delay = respawn_delay
        self.argv = argv or [sys.executable, "-m", "akrelay.process.followers"]
        self.proc: subprocess.Popen[bytes] | None = None
        self.spawned = 0
        self._halt = threading.Event()
        self._lock = threading.Lock()
        self._watcher: threading.Thread | None = None

    @property
    def pid(self) -> int | None:
        proc = self.proc
        return proc.pid if proc is not None else None

    def start(self, ready_timeout: float = 0.0, *, on_ready: Callable[[bool], None] | None = None) -> bool:
        """Start the process; with ``ready_timeout``, wait that long for it to say it is ready (``True``).

        ``on_ready`` (with no ``ready_timeout``): return at once, and call ``on_ready(ready)``
        from a thread when the process has said it is ready, or after :data:`READY_TIMEOUT`
        (``False``): the launcher starts the workers meanwhile (a restart, issue 25).
        """
        with self._lock:
            if self._watcher is not None:
                return True
            self._halt.clear()
            ready = self._spawn(ready_timeout, on_ready)
            self._watcher = threading.Thread(target=self._watch, name="akrelay-followers-watch", daemon=True)
            self._watcher.start()
        return ready

    def _spawn(self, ready_timeout: float = 0.0, on_ready: Callable[[bool], None] | None = None) -> bool:
        read, write = os.pipe()
        try:
            self.proc = subprocess.Popen(self.argv, env={**self.env, READY_FD_ENV: str(write)},
                                         stdin=subprocess.DEVNULL, pass_fds=(write,))
        except BaseException:
            os.close(read)
            raise
        finally:
            os.close(write)
        self.spawned += 1
        if on_ready is not None and ready_timeout <= 0:
            threading.Thread(target=self._await_ready, args=(read, on_ready), name="akrelay-followers-ready",
                             daemon=True).start()
            return False
        try:
            return self._read_ready(read, ready_timeout)
        finally:
            os.close(read)

    @staticmethod
    def _read_ready(read: int, timeout: float) -> bool:
        if timeout <= 0:
            return False
        ready, _, _ = select.select([read], [], [], timeout)
        return bool(ready) and os.read(read, 16).startswith(b"ready")

    def _await_ready(self, read: int, on_ready: Callable[[bool], None]) -> None:
        try:
            ready = self._read_ready(read, READY_TIMEOUT)
        except OSError:
            ready = False
        finally:
            os.close(read)
        if not self._halt.is_set():
            on_ready(ready)

    def _watch(self) -> None:
        while not self._halt.is_set():
            proc = self.proc
            assert proc is not None
            code = proc.wait()
            if self._halt.is_set() or code == 0:
                return
            log.warning("followers: process %d ended with status %s; a new one starts in %.1f s",
                        proc.pid, code, self.respawn_delay)
            if self._halt.wait(self.respawn_delay):
                return
            with self._lock:
                if self._halt.is_set():
                    return
                self._spawn()

    def stop(self, timeout: float = STOP_TIMEOUT) -> None:
        """Ask the process to stop (SIGTERM); kill it if it has not ended within ``timeout`` seconds."""
        with self._lock:
            self._halt.set()
            proc, watcher, self._watcher = self.proc, self._watcher, None
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                log.warning("followers: process %d did not stop within %.1f s; killing it", proc.pid, timeout)
                proc.kill()
                proc.wait()
        if watcher is not None:
            watcher.join(timeout)


if __name__ == "__main__":
    sys.exit(main())
