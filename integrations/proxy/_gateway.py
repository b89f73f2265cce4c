"""The proxy as an RL rollout gateway: any harness pointed at it becomes a rollout worker.

In front of an OpenAI-compatible inference server (vLLM, SGLang), the gateway

* asks the server, on every Chat Completions request, for what training needs when the
  client did not: ``logprobs: true`` and vLLM's ``return_token_ids: true`` (the sampled
  ids, and the prompt ids as the server tokenized them) — the client's own settings win;
* groups calls into episodes: the ``X-Agentcompact-Episode`` / ``-Group`` / ``-Sample``
  headers, or a base-URL prefix ``/rl/g/{group}/e/{episode}/`` (for harnesses that only
  take a base URL: ``OPENAI_BASE_URL=http://gateway/rl/g/task7/e/run3/v1``), else the
  proxy's session;
* compacts each episode at its GRPO group's trigger (``TriggerDraw``: one trigger per
  group, drawn from a seed, so rollouts of one task compact alike);
* records every call (prompt and sampled ids, logprobs), compaction and summary into an
  ``EpisodeCollector`` (and the ``--record`` run folder, when set), in the order they
  happened, on one worker thread: the proxy's plugin manager gets a relay that queues each
  event for the gateway's own plugin manager (``sinks``), so the event loop only queues;
* takes each episode's reward at ``POST /rl/episodes/{id}/reward`` and turns the episode
  into segment rows (the exporter's own builder); once a group has its
  ``group_size`` rewarded episodes (or at ``POST /rl/flush``) the group's advantages are
  computed and its rows are ready: in memory (:meth:`RLGateway.take`, ``GET /rl/rows``)
  and, with ``out``, as an export folder per batch (``batch-00000/segments-00000.parquet``
  …), byte for byte what ``agentcompact export`` writes for the same events.

``GET /rl/episodes`` lists the open episodes (id, group, calls). See ``docs/gateway.md``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import re
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import orjson
import pluggy
from pydantic import BaseModel, ConfigDict, ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from agentcompact import (
    Budget,
    CompactionEvent,
    EpisodeEnd,
    ModelCall,
    SummaryCall,
    hookimpl,
    log_episode_end,
    new_plugin_manager,
)
from agentcompact.errors import ConfigError
from agentcompact.rl.rollout import TriggerDraw, write_batch
from agentcompact.trajectory import EpisodeCollector, EpisodeRows, episode_rows, group_advantages
from agentcompact.trajectory.export import ExportOptions

__all__ = ["GatewayConfig", "RLGateway"]

log = logging.getLogger("agentcompact.proxy")

EPISODE_HEADER = "x-agentcompact-episode"
GROUP_HEADER = "x-agentcompact-group"
SAMPLE_HEADER = "x-agentcompact-sample"
VERSION_HEADER = "x-agentcompact-policy-version"
#: ``/rl/g/{group}/e/{episode}/…``: the episode and group carried by a client's base URL
#: (ids of letters, digits and ``._:@+=-``: the same in the path and the raw path)
_PREFIX = re.compile(r"^/rl/g/([A-Za-z0-9._:@+=-]{1,200})/e/([A-Za-z0-9._:@+=-]{1,200})(/.*)$")
_ID = re.compile(r"^[A-Za-z0-9._:@+=-]{1,200}$")
_T = TypeVar("_T")


@dataclass(frozen=True)
class GatewayConfig:
    """The gateway's settings (``agentcompact proxy --rl-*``).

    :param tokenizer: the policy's tokenizer (a folder or hub name): rows are its ids.
    :param out: a folder for the ready batches (one export folder each); ``None``: memory.
    :param group_size: rewarded episodes that complete a group (its rows are then ready);
        ``None``: groups are ready at ``POST /rl/flush`` only.
    :param token_ids: ask for vLLM's ``return_token_ids`` (vLLM >= 0.10.2; SGLang and
        OpenAI: off, the exporter maps logprob bytes to ids instead).
    :param logprobs: ask for ``logprobs`` when the client did not.
    :param trigger_low: a group's trigger is the proxy's ``trigger`` times a factor drawn
        from ``[trigger_low, trigger_high]`` with ``seed``.
    :param export: the rows' options (advantage mode, unrewarded and length policies).
    :param max_open: episodes held open without a reward; past it the oldest is dropped
        (its events too), with a warning: a harness that never reports stays bounded.
    :param max_waiting: groups held waiting for ``group_size`` rewarded episodes; past it
        the oldest group is made ready as it is, with a warning.
    """

    tokenizer: str
    out: str | None = None
    group_size: int | None = None
    token_ids: bool = True
    logprobs: bool = True
    trigger_low: float = 1.0
    trigger_high: float = 1.0
    seed: int = 0
    export: ExportOptions = field(default_factory=ExportOptions)
    max_open: int = 4096
    max_waiting: int = 1024

    def __post_init__(self) -> None:
        if self.group_size is not None and self.group_size < 1:
            raise ConfigError(f"group_size must be >= 1, got {self.group_size}")
        if self.max_open < 1 or self.max_waiting < 1:
            raise ConfigError(f"max_open and max_waiting must be >= 1, got {self.max_open} "
                              f"and {self.max_waiting}")
        self.export.check()


class _Reward(BaseModel):
    """``POST /rl/episodes/{id}/reward`` body."""

    model_config = ConfigDict(extra="forbid")

    reward: float | None
    stop_reason: str = "complete"
    group_id: str | None = None
    sample_index: int | None = None
    rewards: dict[str, float] = {}
    metadata: dict[str, Any] = {}


@dataclass
class _Open:
    """An episode seen on the wire and not yet rewarded."""

    group: str
    sample: int | None
    version: int | None = None  # the policy version the client last declared
    calls: int = 0
    streams: int = 0  # responses still being relayed (recorded when they end)
    settled: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass
class _Group:
    """A GRPO group: its episodes' rows as they are rewarded."""

    done: list[EpisodeRows] = field(default_factory=list)
    samples: int = 0  # sample indexes handed out by arrival


class _Worker:
    """One thread doing the gateway's recording and row work, in submission order; it
    counts the CPU time it spends (``GET /rl/stats``)."""

    def __init__(self) -> None:
        self.thread: threading.Thread | None = None
        self.cpu_s = 0.0
        self.jobs = 0
        self.pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="agentcompact-gateway", initializer=self._mark)

    def _mark(self) -> None:
        self.thread = threading.current_thread()

    def here(self) -> bool:
        return threading.current_thread() is self.thread

    def submit(self, fn: Callable[..., _T], *args: Any) -> concurrent.futures.Future[_T]:
        return self.pool.submit(self._timed, fn, *args)

    def _timed(self, fn: Callable[..., _T], *args: Any) -> _T:
        t0 = time.thread_time()
        try:
            return fn(*args)
        finally:
            self.cpu_s += time.thread_time() - t0  # only this thread writes it
            self.jobs += 1


class _Relay:
    """A plugin on the proxy's manager queueing the recording hooks for the gateway's
    sinks, in order, on its worker (at once when fired on the worker itself: a call
    rebuilt there stays in its place between the compactions queued around it)."""

    def __init__(self, sinks: pluggy.PluginManager, worker: _Worker) -> None:
        self.sinks, self.worker = sinks, worker

    def _queue(self, fire: Callable[[], None]) -> None:
        if self.worker.here():
            fire()
        else:
            self.worker.submit(_logged, fire)

    @hookimpl
    def agentcompact_log_model_call(self, call: ModelCall) -> None:
        self._queue(lambda: self.sinks.hook.agentcompact_log_model_call(call=call))

    @hookimpl
    def agentcompact_log_summary_call(self, call: SummaryCall) -> None:
        self._queue(lambda: self.sinks.hook.agentcompact_log_summary_call(call=call))

    @hookimpl
    def agentcompact_on_compaction(self, event: CompactionEvent) -> None:
        self._queue(lambda: self.sinks.hook.agentcompact_on_compaction(event=event))


class RLGateway:
    """The gateway's state: episodes, groups, ready batches (module docstring).

    :param config: the gateway's settings.
    :param trigger: the proxy's trigger (tokens), drawn from per group.
    :param pm: the proxy's plugin manager: a relay is registered on it; register what
        must see the events in order (a ``Recorder``) on :attr:`sinks`.
    """

    def __init__(self, config: GatewayConfig, trigger: int, pm: pluggy.PluginManager) -> None:
        from agentcompact.extending import ChatTokenizer

        out = Path(config.out) if config.out is not None else None
        if out is not None and out.exists() and any(out.iterdir()):
            raise ConfigError(f"--rl-out {out}: holds files already; choose an empty or new "
                              "folder (each batch becomes batch-NNNNN/ in it)")
        self.config = config
        self.tok = ChatTokenizer.from_pretrained(config.tokenizer)
        self.draw = TriggerDraw(trigger, config.trigger_low, config.trigger_high, config.seed)
        self.pm = pm
        #: the recording and row work, in order, off the event loop
        self.worker = _Worker()
        #: what sees the recorded events, in order, on the worker thread
        self.sinks = new_plugin_manager()
        self.collector = EpisodeCollector()
        self.sinks.register(self.collector)
        self.relay = _Relay(self.sinks, self.worker)
        pm.register(self.relay, name=f"agentcompact-gateway-{id(self.relay)}")
        self._lock = threading.Lock()
        self._open: dict[str, _Open] = {}
        self._groups: dict[str, _Group] = {}
        self._ready: list[Any] = []  # RowBatch, oldest first
        self._batches = 0

    # --- requests --------------------------------------------------------------------
    @staticmethod
    def route(scope: dict[str, Any]) -> dict[str, Any]:
        """``scope`` with a ``/rl/g/{group}/e/{episode}`` prefix taken off its path (the
        episode and group kept in the scope's headers), else ``scope`` itself."""
        match = _PREFIX.match(scope.get("path", ""))
        if match is None:
            return scope
        group, episode, rest = match.groups()
        raw = scope.get("raw_path")
        prefix = len(scope["path"]) - len(rest)  # ASCII ids: as long in the raw path
        headers = [h for h in scope.get("headers", [])
                   if h[0] not in (EPISODE_HEADER.encode(), GROUP_HEADER.encode())]
        headers += [(EPISODE_HEADER.encode(), episode.encode()),
                    (GROUP_HEADER.encode(), group.encode())]
        return {**scope, "path": rest, "headers": headers,
                "raw_path": raw[prefix:] if isinstance(raw, bytes) else raw}

    def session(self, headers: Mapping[str, str], session: str) -> str:
        """The episode a request belongs to (its header, else the proxy's session); a new
        one is opened with its group and sample index."""
        episode = headers.get(EPISODE_HEADER) or session
        if not _ID.match(episode):
            raise ConfigError(f"{EPISODE_HEADER}: use 1-200 letters, digits or ._:@+=- "
                              "(one id per episode)")
        sample, version = headers.get(SAMPLE_HEADER), headers.get(VERSION_HEADER)
        dropped = None
        with self._lock:
            open_ = self._open.get(episode)
            if open_ is None:
                open_ = self._open[episode] = _Open(
                    headers.get(GROUP_HEADER) or episode,
                    int(sample) if sample and sample.isdigit() else None)
                if len(self._open) > self.config.max_open:
                    dropped = next(iter(self._open))
                    del self._open[dropped]
            if version and version.isdigit():
                open_.version = int(version)
        if dropped is not None:
            log.warning("gateway: %d episodes open without a reward; the oldest (%s) is "
                        "dropped (--rl-max-open)", self.config.max_open, dropped)
            self.worker.submit(self._forget, dropped)
        return episode

    def _forget(self, episode: str) -> None:
        """Drop what was collected of an episode (on the worker: after its queued calls)."""
        if any(e.episode_id == episode for e in self.collector.episodes()):
            self.collector.take(episode)

    def budget(self, session: str, base: Budget) -> Budget:
        """The engine budget of an episode: its group's drawn trigger."""
        with self._lock:
            open_ = self._open.get(session)
        if open_ is None:
            return base
        trigger = self.draw(open_.group)
        return Budget(trigger_tokens=trigger, recent_turns=base.recent_turns,
                      min_recent_turns=base.min_recent_turns,
                      limit_tokens=max(base.limit_tokens or trigger, trigger))

    def ask_for_tokens(self, raw: bytes, body: Mapping[str, Any]) -> bytes:
        """The request body asking for logprobs and token ids the client did not ask for:
        the fields appended to the JSON object's bytes (no re-encoding)."""
        extra = {}
        if self.config.logprobs and "logprobs" not in body:
            extra["logprobs"] = True
        if self.config.token_ids and "return_token_ids" not in body:
            extra["return_token_ids"] = True
        if not extra:
            return raw
        end = raw.rstrip()
        if not end.endswith(b"}"):
            return raw
        fields = orjson.dumps(extra)[1:-1]
        head = end[:-1].rstrip()
        sep = b"" if head.endswith(b"{") else b","
        return head + sep + fields + b"}"

    def call_fields(self, session: str | None) -> dict[str, Any]:
        """What a recorded call of ``session`` carries besides the proxy's fields: its
        group, and the policy version the client declared."""
        with self._lock:
            open_ = self._open.get(session) if session else None
        if open_ is None:
            return {}
        fields: dict[str, Any] = {"group_id": open_.group}
        if open_.version is not None:
            fields["policy_version"] = open_.version
        return fields

    def opened(self, session: str | None) -> None:
        """A response of ``session`` is being relayed."""
        with self._lock:
            open_ = self._open.get(session) if session else None
            if open_ is not None:
                open_.streams += 1
                open_.settled.clear()

    def submit(self, fire: Callable[[], None]) -> None:
        """Run ``fire`` (a call to record) on the worker, in order; a failure is logged."""
        self.worker.submit(_logged, fire)

    def recorded(self, session: str | None) -> None:
        """A response of ``session`` ended and its call was reported (the relay queued it)."""
        with self._lock:
            open_ = self._open.get(session) if session else None
            if open_ is not None:
                open_.calls += 1
                open_.streams -= 1
                if open_.streams <= 0:
                    open_.settled.set()

    def closed(self, session: str | None) -> None:
        """A response of ``session`` ended without a call to record (an error, a client
        that left)."""
        with self._lock:
            open_ = self._open.get(session) if session else None
            if open_ is not None:
                open_.streams -= 1
                if open_.streams <= 0:
                    open_.settled.set()

    # --- episodes, groups, rows ----------------------------------------------------------
    async def reward(self, request: Request) -> Response:
        """``POST /rl/episodes/{episode}/reward``: end the episode; its rows are built."""
        episode = request.path_params["episode"]
        try:
            body = _Reward.model_validate_json(await request.body())
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(x) for x in first["loc"]) or "body"
            return _error(400, f"reward body: {where}: {first['msg']} (send "
                               '{"reward": 1.0, "stop_reason": "complete"})')
        with self._lock:
            open_ = self._open.get(episode)
        if open_ is None:
            return _error(404, f"episode {episode!r} is not open (GET /rl/episodes lists "
                               "the open ones)")
        if open_.streams > 0:
            try:
                await asyncio.wait_for(open_.settled.wait(), timeout=30)
            except TimeoutError:
                return _error(409, f"episode {episode!r} still has a response being relayed")
        result = await self._run(self._end, episode, open_, body)
        return JSONResponse(result)

    def _end(self, episode: str, open_: _Open, body: _Reward) -> dict[str, Any]:
        group = body.group_id or open_.group
        with self._lock:
            state = self._groups.setdefault(group, _Group())
            sample = body.sample_index if body.sample_index is not None else (
                open_.sample if open_.sample is not None else state.samples)
            state.samples += 1
            self._open.pop(episode, None)
        log_episode_end(EpisodeEnd(episode, body.reward, body.stop_reason, group_id=group,
                                   sample_index=sample, rewards=dict(body.rewards),
                                   metadata=dict(body.metadata)), pm=self.sinks)
        events = self.collector.take(episode)
        if not events.calls:  # every response failed: nothing to train on
            return {"episode_id": episode, "group_id": group, "segments": 0, "ready": False}
        rows = episode_rows(events, self.tok, self.config.export)
        with self._lock:
            state.done.append(rows)
            full = self.config.group_size is not None and len(state.done) >= \
                self.config.group_size
            waiting = [g for g, s in self._groups.items() if s.done and g != group]
        if full:
            self._emit([group])
        if len(waiting) >= self.config.max_waiting:
            log.warning("gateway: %d groups wait for %s rewarded episodes; the oldest (%s) "
                        "is made ready as it is (--rl-max-waiting)", len(waiting),
                        self.config.group_size, waiting[0])
            self._emit([waiting[0]])
        return {"episode_id": episode, "group_id": group, "segments": len(rows.rows),
                "ready": full}

    async def flush(self, request: Request) -> Response:
        """``POST /rl/flush``: every group's rewarded episodes become ready rows."""
        with self._lock:
            groups = [g for g, s in self._groups.items() if s.done]
        result = await self._run(self._emit, groups)
        return JSONResponse(result)

    def _emit(self, groups: list[str]) -> dict[str, Any]:
        """Advantages over ``groups``' episodes; the rows ready (and written)."""
        with self._lock:
            episodes = [e for g in groups for e in self._groups[g].done]
            for g in groups:
                self._groups.pop(g, None)
        if not episodes:
            return {"groups": 0, "rows": 0}
        batch = group_advantages(episodes, self.config.export, tokenizer=self.tok)
        with self._lock:
            number = self._batches
            self._batches += 1
            self._ready.append(batch)
        if self.config.out is not None:
            write_batch(batch, Path(self.config.out) / f"batch-{number:05d}",
                        self.config.export)
        return {"groups": len(groups), "rows": len(batch.rows), "batch": number}

    def take(self) -> list[Any]:
        """The ready batches (``RowBatch``), oldest first, removed from the gateway."""
        with self._lock:
            ready, self._ready = self._ready, []
        return ready

    async def rows(self, request: Request) -> Response:
        """``GET /rl/rows``: the ready rows as JSON (token arrays as lists), consumed."""
        batches = self.take()
        body = {"rows": [_plain(r) for b in batches for r in b.rows],
                "episodes": [e for b in batches for e in b.episodes],
                "counts": [b.counts for b in batches]}
        return Response(orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY),
                        media_type="application/json")

    async def stats(self, request: Request) -> Response:
        """``GET /rl/stats``: what the gateway holds and its worker's CPU time (seconds)."""
        with self._lock:
            held = {"episodes_open": len(self._open), "groups_waiting": len(self._groups),
                    "batches_ready": len(self._ready), "batches": self._batches}
        return JSONResponse({**held, "worker_jobs": self.worker.jobs,
                             "worker_cpu_s": round(self.worker.cpu_s, 6)})

    async def episodes(self, request: Request) -> Response:
        """``GET /rl/episodes``: the open episodes."""
        with self._lock:
            listed = [{"episode_id": e, "group_id": o.group, "calls": o.calls,
                       "sample_index": o.sample} for e, o in self._open.items()]
        return JSONResponse({"episodes": listed})

    async def _run(self, fn: Callable[..., _T], *args: Any) -> _T:
        return await asyncio.wrap_future(self.worker.submit(fn, *args))

    def close(self) -> None:
        if self.pm.is_registered(self.relay):
            self.pm.unregister(self.relay)
        self.worker.pool.shutdown(wait=True)

    def routes(self) -> list[Any]:
        from starlette.routing import Route

        return [Route("/rl/episodes/{episode}/reward", self.reward, methods=["POST"]),
                Route("/rl/flush", self.flush, methods=["POST"]),
                Route("/rl/rows", self.rows, methods=["GET"]),
                Route("/rl/episodes", self.episodes, methods=["GET"]),
                Route("/rl/stats", self.stats, methods=["GET"])]


def _logged(fire: Callable[[], None]) -> None:
    try:
        fire()
    except Exception:  # a recording failure never reaches the client; it is logged
        log.exception("gateway: recording a call failed")


def _plain(row: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v.tolist() if hasattr(v, "tolist") else v for k, v in row.items()}


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": "invalid_request_error"}},
                        status_code=status)
