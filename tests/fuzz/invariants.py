"""The invariants every ``Engine.compact`` call must keep, checked from outside.

``check_session`` drives engines over one history the way agents call them (at turn
starts, then the end), two engines of different settings sharing one prefix store, and
checks every result: input never mutated; output valid for the provider (the dialect's
rules, problems the input already had aside, plus the thinking-loop rule); within the
limit, or flagged ``over_budget``, or a documented ``OverBudgetError`` in strict mode; the
same output as an engine of the same settings alone (no cross-config reuse, determinism);
every pinned text present (what the user typed, within the pin budget: pins an event
reports ``unpinned`` aside); every message holding a type the code does not model sent
verbatim (the same object); fed back in (rewrite mode), every earlier compaction message
carried verbatim; no canary secret in any error, event or log record.
"""

from __future__ import annotations

import copy
import json
import logging
import traceback
from dataclasses import dataclass, field
from typing import Any

from agentcompact import (
    Budget,
    CompactionEvent,
    Engine,
    InMemoryPrefixStore,
    OverBudgetError,
    StrategySettings,
    hookimpl,
    new_plugin_manager,
    pinned_texts,
)
from agentcompact._turns import problems, split_turns, thinking_loop_error

from .histories import PIN, SECRET, UNMODELLED


@dataclass
class Tally:
    histories: int = 0
    calls: int = 0
    violations: list[str] = field(default_factory=list)


class _Capture(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


class _Plugin:
    def __init__(self) -> None:
        self.events: list[CompactionEvent] = []

    @hookimpl
    def agentcompact_pin(self, message: Any, index: int, dialect: Any) -> bool:
        try:
            return PIN in dialect.text_of(message)
        except Exception:
            return False

    @hookimpl
    def agentcompact_on_compaction(self, event: CompactionEvent) -> None:
        self.events.append(event)


def dump(messages: list[Any]) -> str:
    """A comparable text of a message list (dicts as JSON, framework objects by repr)."""
    out = []
    for m in messages:
        if isinstance(m, dict):
            out.append(json.dumps(m, sort_keys=True))
        else:
            out.append(repr(m.model_dump()) if hasattr(m, "model_dump") else repr(m))
    return "\n".join(out)


@dataclass(frozen=True)
class Config:
    trigger: int
    recent: int
    minimum: int
    strict: bool
    strategy: str  # "cliff", "summary", "parallel" or "naive" (a third-party strategy)
    counter: str = "chars"  # or "tiktoken" (exact o200k, the default engines count with)
    summarizer: str = ""  # base URL of the upstream simulator ("summary", "parallel")


class Naive:
    """A third-party strategy that knows nothing about pins, kept messages or budgets."""

    name = "naive"

    def compact(self, request: Any) -> Any:
        from agentcompact._markers import COMPACTION_HEADER
        from agentcompact.strategies import Rendered

        text = COMPACTION_HEADER + "\n\n(earlier work omitted)"
        return Rendered(request.dialect.text_message(text), 12)


def make(dialect: str, config: Config, store: Any = None) -> tuple[Engine, _Plugin]:
    plugin = _Plugin()
    pm = new_plugin_manager()
    pm.register(plugin)
    strategy: Any = Naive() if config.strategy == "naive" else config.strategy
    if config.strategy in ("summary", "parallel"):
        strategy = StrategySettings(config.strategy, options={
            "base_url": config.summarizer, "model": "sim-summarizer", "api_key": SECRET,
            "max_retries": 0})
    budget = Budget(config.trigger, min_recent_turns=config.minimum, recent_turns=config.recent)
    engine = Engine(strategy, dialect_of(dialect), budget, counter=config.counter, plugins=pm,
                    store=store, strict=config.strict)
    return engine, plugin


def dialect_of(name: str) -> Any:
    if name == "langchain":
        from agentcompact.integrations.langgraph import LangChainDialect

        return LangChainDialect()
    return name


def _texts(engine: Engine, messages: list[Any]) -> list[str]:
    out = []
    for m in messages:
        try:
            out.append(engine.dialect.text_of(m))
        except Exception:
            out.append("")
    return out


def _call(engine: Engine, plugin: _Plugin, ctx: list[Any], tally: Tally, where: str
          ) -> Any:
    tally.calls += 1
    before = copy.deepcopy(ctx)
    try:
        result = engine.compact(ctx)
    except OverBudgetError as exc:
        text = "".join(traceback.format_exception(exc))
        if SECRET in text or exc.__context__ is not None:
            tally.violations.append(f"{where}: OverBudgetError carries history")
        if not (engine.strict and exc.tokens > exc.limit):
            tally.violations.append(f"{where}: OverBudgetError outside strict mode")
        _unchanged(before, ctx, tally, where)
        return None
    except Exception as exc:
        tally.violations.append(f"{where}: raised {type(exc).__name__}")
        return None
    _unchanged(before, ctx, tally, where)
    out = result.messages
    d = engine.dialect
    inherited = {key for key, _ in problems(ctx, d, allow_pending=True)}
    new = [str(e) for key, e in problems(out, d, allow_pending=True) if key not in inherited]
    if new:
        tally.violations.append(f"{where}: invalid output: {new[0]}")
    if d.thinking_loops():
        err = thinking_loop_error(ctx, len(ctx), out, d)
        if err:
            tally.violations.append(f"{where}: {err}")
    if result.over_budget != (result.tokens_after > engine.budget.limit):
        tally.violations.append(f"{where}: over_budget flag wrong")
    if engine.strict and result.tokens_after > engine.budget.limit:
        tally.violations.append(f"{where}: strict mode sent an over-limit context")
    if result.tokens_after != engine.count(out) + 0:
        tally.violations.append(f"{where}: tokens_after {result.tokens_after} is not the "
                                f"count of the output {engine.count(out)}")
    out_text = "\n".join(_texts(engine, out))
    unpinned = {i for event in plugin.events for i in event.unpinned}  # past the pin budget
    for i, text in enumerate(_texts(engine, ctx)):
        if PIN in text and i not in unpinned and not any(m is ctx[i] for m in out):
            for piece in pinned_texts(d, ctx[i]):
                if piece not in out_text:
                    tally.violations.append(f"{where}: pinned message {i} lost")
                    break
        if d.is_kept(ctx[i]) and not any(m is ctx[i] for m in out):
            tally.violations.append(f"{where}: kept message {i} ({d.role(ctx[i])}) lost")
        if UNMODELLED in dump([ctx[i]]) and not any(m is ctx[i] for m in out):
            tally.violations.append(f"{where}: message {i} with a type the code does not "
                                    "model was not sent verbatim")
    for event in plugin.events:
        if SECRET in (event.error or "") or any(SECRET in e for e in event.errors):
            tally.violations.append(f"{where}: secret in an event error")
    return result


def _unchanged(before: list[Any], ctx: list[Any], tally: Tally, where: str) -> None:
    if dump(before) != dump(ctx):
        tally.violations.append(f"{where}: input mutated")


def check_session(dialect: str, messages: list[Any], config: Config, other: Config,
                  tally: Tally) -> None:
    tally.histories += 1
    capture = _Capture()
    logger = logging.getLogger("agentcompact")
    logger.addHandler(capture)
    try:
        _session(dialect, messages, config, other, tally)
    finally:
        logger.removeHandler(capture)
    for record in capture.records:
        if SECRET in record.getMessage():
            tally.violations.append(f"{dialect}: secret in a log record")


def _session(dialect: str, messages: list[Any], config: Config, other: Config,
             tally: Tally) -> None:
    shared = InMemoryPrefixStore()
    a, pa = make(dialect, config, shared)
    b, pb = make(dialect, other, shared)
    alone, palone = make(dialect, config)
    starts = split_turns(messages, a.dialect).starts
    points = sorted({*[s for s in starts if s > 0][-4:], len(messages)})
    last = None
    for c in points:
        ctx = messages[:c]
        ra = _call(a, pa, ctx, tally, f"{dialect}@{c}")
        _call(b, pb, ctx, tally, f"{dialect}@{c}/other")
        rl = _call(alone, palone, ctx, tally, f"{dialect}@{c}/alone")
        if (ra is None) != (rl is None) or (
                ra is not None and rl is not None and dump(ra.messages) != dump(rl.messages)):
            tally.violations.append(f"{dialect}@{c}: output depends on another engine's "
                                    "entries in the shared store (or is not deterministic)")
        last = ra
    if last is None or not last.compacted:
        return
    # rewrite mode: the harness keeps what was sent, grows it, and compacts again
    fed = list(last.messages) + messages[len(messages) - (len(messages) - points[-1]):]
    fresh, pf = make(dialect, config)
    again = _call(fresh, pf, fed, tally, f"{dialect}/rewrite")
    if again is None:
        return
    for m in fed:
        if fresh.dialect.is_synthetic(m) and not any(x is m for x in again.messages):
            tally.violations.append(f"{dialect}/rewrite: an earlier compaction message "
                                    "was not carried verbatim")
