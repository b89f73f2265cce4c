"""``agentcompact proxy``: run the compaction proxy in the foreground.

``add_parser(subparsers)`` adds the ``proxy`` sub-command to the ``agentcompact`` command;
``run(args)`` serves until interrupted. Every flag has an ``AGENTCOMPACT_*`` environment
variable (flags win); see ``docs/proxy.md``.
"""

from __future__ import annotations

import argparse
import gc
import logging
import os
import sys
from typing import TYPE_CHECKING, Any

import orjson

from agentcompact.errors import AgentCompactError

from .._threaded_server import DEFAULT_KEEP_ALIVE, server_config
from ._config import ENV_PREFIX, ProxyConfig, engine_settings

if TYPE_CHECKING:  # the gateway needs the export extra (numpy, pyarrow): imported on use
    from ._gateway import GatewayConfig
from ._memory import keep_freed

__all__ = ["add_parser", "build_config", "build_gateway", "main", "run", "start_up",
           "warn_small_trigger"]

log = logging.getLogger("agentcompact.proxy")


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``proxy`` to an ``argparse`` sub-parsers object; returns the new parser."""
    p: argparse.ArgumentParser = subparsers.add_parser(
        "proxy", help="run the transparent compaction proxy",
        description="Transparent HTTP proxy that compacts Anthropic / OpenAI / Gemini request "
                    "bodies. "
                    f"Each flag can also be set by an environment variable {ENV_PREFIX}<FLAG> "
                    "(e.g. AGENTCOMPACT_TRIGGER); flags win.")
    _add_arguments(p)
    p.set_defaults(func=run)
    return p


#: ``--keep-memory``'s default: a few 3M-token bodies (12 MB each) of freed memory kept
KEEP_MEMORY_MIB = 128


def _add_arguments(p: argparse.ArgumentParser) -> None:
    a = p.add_argument
    a("--host", help="interface to bind (default 127.0.0.1)")
    a("--port", type=int, help="port (default 8719; 0 = any free port)")
    a("--strategy", help="compaction strategy from the plugin registry (default cliff)")
    a("--strategy-option", action="append", metavar="KEY=VALUE", dest="strategy_option",
      help="strategy factory setting (VALUE parsed as JSON when it parses); repeatable")
    a("--trigger", type=int, metavar="TOKENS",
      help="compact when a request (messages, system prompt and tools) exceeds this many "
           "tokens (default 100000)")
    a("--target", type=int, metavar="TOKENS",
      help="size to compact down to (default: the request's fixed part - system prompt, "
           "tools, instruction items - plus 0.26 of what the trigger leaves besides it, at "
           "least 6000 tokens of it and at most half)")
    a("--counter", help="token counter: tiktoken (default), tiktoken:ENC, hf:PATH, chars")
    a("--anthropic-upstream", metavar="URL", help="default https://api.anthropic.com")
    a("--openai-upstream", metavar="URL", help="default https://api.openai.com")
    a("--gemini-upstream", metavar="URL",
      help="default https://generativelanguage.googleapis.com")
    a("--record", metavar="DIR", help="record every model call and compaction for RL export")
    a("--shadow", action="store_true", default=None,
      help="compute and log compactions, forward every request unchanged")
    a("--strict", action="store_true", default=None,
      help="refuse (HTTP 400) a request still over budget after compaction")
    a("--debug-dir", metavar="DIR", help="dump incoming/outgoing bodies (redacted) here")
    a("--no-reactive", dest="reactive", action="store_false", default=None,
      help="do not compact and replay after a provider context-length error")
    a("--max-sessions", type=int, help="sessions kept in memory (default 256)")
    a("--archive", metavar="FILE", help="SQLite file archiving what compaction drops, "
                                         "instead of the store (served by 'agentcompact "
                                         "mcp --archive FILE')")
    a("--quiet", dest="log_requests", action="store_false", default=None,
      help="no per-request JSON log lines")
    a("--store", metavar="URL",
      help="where compacted prefixes and dropped originals live, shared by replicas: "
           "sqlite:///PATH, redis://HOST:PORT, or memory (this process only); default "
           "sqlite in --state-dir")
    a("--state-dir", metavar="DIR",
      help="folder of the default store (default $AGENTCOMPACT_STATE_DIR or ~/.agentcompact)")
    a("--tenancy", choices=("auto", "credential", "single"),
      help="scope the store, archive and handles per tenant: credential (by API key), "
           "single (one person), auto (default: credential once --store or --archive is "
           "given); secret: $AGENTCOMPACT_TENANT_SECRET (docs/deploy.md)")
    a("--tenant-header", metavar="NAME",
      help="a header naming the tenant, set by a gateway in front (instead of the API key)")
    a("--log-level", default="INFO", type=_log_level, metavar="LEVEL",
      help=f"logging level: {', '.join(_LEVELS)} (default INFO)")
    a("--keep-alive", type=float, metavar="SECONDS",
      help="seconds an idle client connection stays open, announced as 'Keep-Alive: "
           f"timeout=N' (default {DEFAULT_KEEP_ALIVE:.0f})")
    _add_gateway_arguments(p)
    a("--keep-memory", type=int, default=KEEP_MEMORY_MIB, metavar="MIB",
      help="freed memory the allocator keeps for the next large body instead of returning "
           f"it, in MiB (default {KEEP_MEMORY_MIB}; 0: the allocator's defaults; glibc "
           "only; see docs/proxy.md, Latency)")


def _add_gateway_arguments(p: argparse.ArgumentParser) -> None:
    """The RL gateway's flags (``docs/gateway.md``); ``--rl-tokenizer`` turns it on."""
    a = p.add_argument
    a("--rl-tokenizer", metavar="PATH", help="run as an RL rollout gateway for a policy with "
      "this tokenizer (folder or hub name): token ids and logprobs asked of the server, "
      "episodes, rewards at POST /rl/episodes/{id}/reward, rows")
    a("--rl-out", metavar="DIR", help="write each ready batch of rows here (one export folder "
      "per batch); default: in memory (GET /rl/rows)")
    a("--rl-group-size", type=int, metavar="N",
      help="rewarded episodes that complete a GRPO group (its rows are then ready); default: "
           "at POST /rl/flush")
    a("--rl-trigger-low", type=float, default=1.0, metavar="F",
      help="a group's trigger is --trigger times a factor drawn from [low, high] (default 1)")
    a("--rl-trigger-high", type=float, default=1.0, metavar="F", help="see --rl-trigger-low")
    a("--rl-seed", type=int, default=0, help="seed of the groups' trigger draws (default 0)")
    a("--rl-advantage", default="grpo", help="advantage over a group's episodes: grpo "
      "(default), drgrpo, rloo, none")
    a("--rl-max-open", type=int, default=4096, metavar="N",
      help="episodes held open without a reward; the oldest is dropped past it (default 4096)")
    a("--rl-max-waiting", type=int, default=1024, metavar="N",
      help="groups waiting for --rl-group-size episodes; the oldest is made ready past it "
           "(default 1024)")
    a("--rl-no-token-ids", dest="rl_token_ids", action="store_false", default=True,
      help="do not ask for vLLM's return_token_ids (SGLang, OpenAI): logprob bytes are "
           "mapped to the tokenizer's ids instead")


def build_gateway(args: argparse.Namespace) -> GatewayConfig | None:
    """The gateway's settings from the ``--rl-*`` flags (``None``: not a gateway)."""
    tokenizer = getattr(args, "rl_tokenizer", None)
    if not tokenizer:
        return None
    from agentcompact.trajectory.export import ExportOptions

    from ._gateway import GatewayConfig

    return GatewayConfig(
        tokenizer=tokenizer, out=args.rl_out, group_size=args.rl_group_size,
        token_ids=args.rl_token_ids, trigger_low=args.rl_trigger_low,
        trigger_high=args.rl_trigger_high, seed=args.rl_seed,
        export=ExportOptions(advantage=args.rl_advantage), max_open=args.rl_max_open,
        max_waiting=args.rl_max_waiting)


def build_config(args: argparse.Namespace) -> ProxyConfig:
    """Defaults < ``AGENTCOMPACT_*`` environment < flags."""
    overrides = {k: getattr(args, k, None) for k in (
        "host", "port", "counter", "anthropic_upstream", "openai_upstream", "gemini_upstream",
        "record", "shadow", "strict", "debug_dir", "reactive", "max_sessions", "log_requests",
        "store", "state_dir", "archive", "tenancy", "tenant_header", "keep_alive")}
    options = _options(getattr(args, "strategy_option", None) or [])
    overrides.update(engine_settings(
        os.environ, trigger=getattr(args, "trigger", None), target=getattr(args, "target", None),
        strategy=getattr(args, "strategy", None), strategy_options=options or None))
    return ProxyConfig.from_env(**overrides)


def _options(items: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise AgentCompactError(f"--strategy-option expects KEY=VALUE, got {item!r}")
        try:
            out[key] = orjson.loads(value)
        except orjson.JSONDecodeError:
            out[key] = value
    return out


#: the collector's thresholds in the proxy process (Python's default: 700, 10, 10)
GC_THRESHOLDS = (50_000, 20, 10)


def tune_gc() -> None:
    """Set up the proxy process's garbage collector as long-running servers do: what was
    loaded at start is frozen (never scanned again), and young collections come every
    50,000 allocations, not 700. A long history's first request allocates millions of
    objects that live through its compaction; with the defaults the collector scanned
    them again and again (a quarter of the time of an 8,000-turn history's first
    request, and growing faster than the history)."""
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


def run(args: argparse.Namespace) -> int:
    """Serve the proxy until interrupted; returns the exit status."""
    import uvicorn

    from .._threaded_server import listening_socket
    from ._app import create_app

    _setup_logging(getattr(args, "log_level", "INFO"))
    try:
        config = build_config(args)
        app = create_app(config, gateway=build_gateway(args))
        sock = listening_socket(config.host, config.port)  # before announcing the address
    except AgentCompactError as exc:
        print(f"agentcompact proxy: {exc}", file=sys.stderr)
        return 2
    start_up(config.budget.trigger, args)
    mode = "shadow" if config.shadow else ("strict" if config.strict else "active")
    log.info("agentcompact proxy on http://%s:%d (%s, strategy=%s, trigger=%d tokens)",
             config.host, sock.getsockname()[1], mode, config.strategy_settings.name,
             config.budget.trigger)
    tune_gc()
    uvicorn.Server(server_config(app, config.host, config.port,
                                 keep_alive=config.keep_alive)).run(sockets=[sock])
    return 0


#: today's coding CLIs send this much that compaction keeps (system prompt, tools,
#: instruction items) before any history: Claude Code 2.1 ~11k tokens, Codex 0.171 ~13k
HARNESS_FIXED_TOKENS = 13_000


def start_up(trigger: int, args: argparse.Namespace) -> None:
    """What ``agentcompact proxy`` and ``agentcompact run`` do once their proxy is built:
    warn about a small trigger and let glibc keep freed memory (``--keep-memory``)."""
    warn_small_trigger(trigger)
    keep_freed(getattr(args, "keep_memory", KEEP_MEMORY_MIB))


def warn_small_trigger(trigger: int) -> None:
    """Warn at start-up about a trigger today's harnesses' fixed prompt alone would fill half
    of (each session's first request is checked against its own fixed part too)."""
    if trigger < 2 * HARNESS_FIXED_TOKENS:
        log.warning("trigger %d tokens: Claude Code and Codex send ~%dk tokens of system "
                    "prompt, tools and instructions that compaction keeps; a trigger below "
                    "%d leaves them little room (see docs/proxy.md)", trigger,
                    HARNESS_FIXED_TOKENS // 1000, 2 * HARNESS_FIXED_TOKENS)


_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def _log_level(value: str) -> str:
    """``--log-level``, checked while parsing (logging would raise at start-up)."""
    if value.upper() not in _LEVELS:
        raise argparse.ArgumentTypeError(f"unknown level {value!r}; use one of "
                                         f"{', '.join(_LEVELS)}")
    return value.upper()


def _setup_logging(level: str) -> None:
    logger = logging.getLogger("agentcompact")
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(message)s"))
        logger.addHandler(handler)
    logger.setLevel(level.upper())


def main(argv: list[str] | None = None) -> int:
    """``python -m agentcompact.integrations.proxy``: the ``proxy`` sub-command alone."""
    parser = argparse.ArgumentParser(prog="agentcompact proxy",
                                     description=__doc__.splitlines()[0] if __doc__ else None)
    _add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
