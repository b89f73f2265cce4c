"""The episodes of pass 2 exported in order, in this process or by worker processes.

With ``ExportOptions(workers=N)`` the episodes are read, segmented and turned into rows
by N worker processes, a few episodes per worker sent ahead of the one being written,
and written by the exporting process in the same order: the output does not depend on
N. ``ray_export`` runs the same per-episode work on Ray actors (``init_worker``,
``run_job``, ``replay_records``).
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import pickle
import signal
import sys
import warnings
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

from ..errors import TrajectoryError
from ._export_options import ExportOptions
from ._export_rows import EpisodeJob, EpisodeResult, ExportContext, export_episode
from ._tokenize import ChatTokenizer

#: ``ExportOptions(workers=None)``: the CPUs this process may run on, at most this many,
MAX_AUTO_WORKERS = 8
#: and at most one worker per this many episodes (a small export stays in-process): a
#: forked worker starts in milliseconds, a spawned one imports transformers and unpickles
#: the tokenizer first (1-2 s of CPU each)
_EPISODES_PER_WORKER = {"fork": 8, "forkserver": 64, "spawn": 64}
#: episodes sent ahead per worker (results are written in order: this bounds what waits)
_AHEAD = 2

_worker: ExportContext | None = None  # a worker process's context (set by init_worker)


def available_cpus() -> int:
    """The CPUs this process may run on (its affinity mask where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - macOS, Windows
        return os.cpu_count() or 1


def worker_count(opts: ExportOptions, episodes: int, start_method: str) -> int:
    if opts.workers is not None:
        return min(opts.workers, max(1, episodes))
    per = _EPISODES_PER_WORKER.get(start_method, 64)
    return max(1, min(available_cpus(), MAX_AUTO_WORKERS, episodes // per))


class _Capture(logging.Handler):
    """A worker's log records, kept to be handled by the exporting process in episode
    order (so they reach its handlers, ``caplog`` included, as in-process)."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        record.msg, record.args = record.getMessage(), None  # args may not pickle
        if record.exc_info:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
            record.exc_info = None
        self.records.append(record)


def init_worker(logs: list[Path], tok: ChatTokenizer, opts: ExportOptions,
                 levels: dict[str, int], disable: int) -> None:
    """Per worker process, once: its context, and its logging routed to ``_Capture``."""
    global _worker
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C: the exporting process stops us
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one thread per worker process
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
    root.addHandler(_Capture())
    for name, level in levels.items():
        logging.getLogger(name or None).setLevel(level)
    logging.disable(disable)
    _worker = ExportContext(logs, tok, opts)


def run_job(job: EpisodeJob) -> EpisodeResult:
    """In a worker process: ``export_episode`` with its log records attached."""
    assert _worker is not None, "worker not initialized"
    capture = next(h for h in logging.getLogger().handlers if isinstance(h, _Capture))
    try:
        done = export_episode(_worker, job)
    except Exception as exc:
        raise _portable(exc) from None
    finally:
        records, capture.records = capture.records, []
    done.records = records
    return done


def _portable(exc: Exception) -> Exception:
    """``exc`` if it survives pickling (the exporting process re-raises it as it is), else
    a ``TrajectoryError`` with its type and message."""
    try:
        pickle.loads(pickle.dumps(exc))
    except Exception:
        return TrajectoryError(f"{type(exc).__name__}: {exc}")
    return exc


def log_levels() -> dict[str, int]:
    """Effective levels of the root logger and of agentcompact's, for the workers."""
    names = [n for n, lg in logging.root.manager.loggerDict.items()
             if n.startswith("agentcompact") and isinstance(lg, logging.Logger)]
    return {name: logging.getLogger(name or None).getEffectiveLevel()
            for name in ["", "agentcompact", *names]}


class ProcessEpisodes:
    """Episodes exported in order: in this process (``workers == 1``), or by a pool of
    worker processes with at most ``_AHEAD`` episodes per worker sent ahead of the one
    being written (memory stays bounded), results taken in submission order.

    On any exception, KeyboardInterrupt included, pending episodes are cancelled and the
    workers terminated before it propagates.
    """

    def __init__(self, ctx: ExportContext, workers: int, start_method: str) -> None:
        self.ctx, self.workers, self.start_method = ctx, workers, start_method
        self._pool: ProcessPoolExecutor | None = None

    def __enter__(self) -> ProcessEpisodes:
        if self.workers > 1:
            ctx = self.ctx
            mp = multiprocessing.get_context(self.start_method)
            if self.start_method == "fork":
                _load_plugins()
            with _fork_guard(self.start_method):
                self._pool = ProcessPoolExecutor(
                    self.workers, mp_context=mp, initializer=init_worker,
                    initargs=(ctx.logs, ctx.tok, ctx.opts, log_levels(),
                              logging.root.manager.disable))
                self._pool.submit(int)  # fork: all processes start on the first submit
        return self

    def __exit__(self, kind: type[BaseException] | None, *_: object) -> None:
        self.ctx.close()
        pool, self._pool = self._pool, None
        if pool is None:
            return
        if kind is None:
            pool.shutdown(wait=True)
            return
        processes = list((getattr(pool, "_processes", None) or {}).values())
        pool.shutdown(wait=False, cancel_futures=True)
        for process in processes:  # a long episode need not finish: stop now
            if process.is_alive():
                process.terminate()
        for process in processes:
            process.join(5)

    def run(self, jobs: Iterator[EpisodeJob]) -> Iterator[EpisodeResult]:
        if self._pool is None:
            for job in jobs:
                yield export_episode(self.ctx, job)
            return
        ahead: deque[Future[EpisodeResult]] = deque()
        for job in jobs:
            ahead.append(self._pool.submit(run_job, job))
            if len(ahead) > _AHEAD * self.workers:
                yield self._take(ahead.popleft())
        while ahead:
            yield self._take(ahead.popleft())

    @staticmethod
    def _take(future: Future[EpisodeResult]) -> EpisodeResult:
        try:
            done = future.result()
        except BrokenProcessPool as exc:
            raise TrajectoryError(f"export worker process died: {exc}") from exc
        return replay_records(done)


def replay_records(done: EpisodeResult) -> EpisodeResult:
    """Hand the log records a worker emitted for ``done`` (``run_job``) to this process's
    loggers, as if the episode had been exported here; returns ``done``."""
    for record in done.records:
        log = logging.getLogger(record.name)
        if log.isEnabledFor(record.levelno):
            log.handle(record)
    return done


def _load_plugins() -> None:
    """Load the installed plugins (the dialects episodes are read with) in the exporting
    process before it forks: otherwise every worker loads them on its first episode
    (entry points scanned, plugin modules imported), about 0.1 s of CPU per worker."""
    from .._pluginmanager import registry  # imported late, as segments.get_dialect does

    registry().dialect_names()


def default_start_method() -> str:
    """``fork`` on Linux (workers start in milliseconds, sharing the loaded tokenizer),
    else ``spawn``."""
    methods = multiprocessing.get_all_start_methods()
    return "fork" if sys.platform == "linux" and "fork" in methods else "spawn"


@contextlib.contextmanager
def _fork_guard(start_method: str) -> Iterator[None]:
    """Around forking the workers: ``TOKENIZERS_PARALLELISM=false`` in their environment
    (the tokenizers library's thread pool does not survive a fork; with the variable unset
    it would print a warning in each child and turn parallelism off itself, with it set to
    true a child would wait on threads that do not exist), and Python 3.12's warning about
    forking a process that has threads (those threads are the tokenizer's, which the
    workers never use) silenced."""
    if start_method != "fork":
        yield
        return
    saved = os.environ.get("TOKENIZERS_PARALLELISM")
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=r".*use of fork\(\) may lead to deadlocks",
                                    category=DeprecationWarning)
            yield
    finally:
        if saved is None:
            del os.environ["TOKENIZERS_PARALLELISM"]
        else:
            os.environ["TOKENIZERS_PARALLELISM"] = saved

