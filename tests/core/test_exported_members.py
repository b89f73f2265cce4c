"""The public surface, pinned (as httpx's ``tests/test_exported_members.py``).

Implementation modules are private (``_x.py``); each public module or package lists what
users import in ``__all__``. ``PUBLIC`` pins every public module and its exact ``__all__``:
a new public module, or a name added to or dropped from one, fails here until the change
is made on purpose (the surface is a promise to users). The modules are found on disk
and their ``__all__`` read from source, so the pins hold without any extra installed; the
import checks skip a module whose extra is missing.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

import agentcompact
import agentcompact.integrations
import agentcompact.plugins

PUBLIC: dict[str, list[str]] = {
    "agentcompact": ["AgentCompactError", "Archive", "ArchiveError", "ArchivedItem",
        "BackgroundCompactor", "BackgroundStats", "Budget", "CharEstimateCounter",
        "CompactionError", "CompactionEvent", "CompactionRequest", "CompactionResult",
        "ConfigError", "DEFAULT_TARGET_FLOOR", "DEFAULT_TARGET_SHARE", "Dialect",
        "DialectError", "DroppedItem", "Engine", "EpisodeEnd", "ExpandPage", "ExportError",
        "HFTokenizerCounter", "InMemoryPrefixStore", "LocalSummarizer", "MemoryArchive",
        "ModelCall", "OverBudgetError", "PIN_SHARE", "Part", "PluginError", "PrefixEntry",
        "PrefixStore", "ProxyError", "Rendered", "SINGLE_TENANT", "SQLiteArchive", "SearchHit",
        "SegmentRowError", "StoreError", "Strategy", "StrategySettings", "Summarizer",
        "SummarizerError", "SummarizerOverflow", "SummaryCall", "SummaryOutput", "Tenant",
        "TiktokenCounter", "TokenCounter", "TokenizerError", "TornLineError", "TrajectoryError",
        "Turns", "UpstreamDropped", "UpstreamError", "ValidationError", "__version__", "expand",
        "expand_text", "get_dialect", "get_plugin_manager", "hookimpl", "hookspec",
        "log_episode_end", "log_model_call", "log_summary_call", "new_plugin_manager",
        "open_archive", "pinned_texts", "redact", "search_dropped", "split_turns", "tenant_of",
        "typed_pieces", "validate"],
    "agentcompact.dialects": ["AnthropicDialect", "Dialect", "GeminiDialect",
        "OpenAIChatDialect", "OpenAIResponsesDialect", "Part", "digest_of", "head_tail",
        "truncated"],
    "agentcompact.extending": ["ChatTokenizer", "DEFAULT_PAGE_CHARS", "FixedTokens", "MessageMeter",
        "get_strategy_factory", "load_plugins", "make_counter", "new_id", "redact_headers",
        "registry", "search_text"],
    "agentcompact.errors": ["AgentCompactError", "ArchiveError", "CompactionError",
        "ConfigError", "DialectError", "ExportError", "OverBudgetError", "PluginError",
        "ProxyError", "SegmentRowError", "StoreError", "SummarizerError", "SummarizerOverflow",
        "TokenizerError", "TornLineError", "TrajectoryError", "UpstreamDropped", "UpstreamError",
        "ValidationError"],
    "agentcompact.integrations": [],
    "agentcompact.integrations.adk": ["CompactionCallback", "GenAIDialect",
        "agentcompact_register_dialects"],
    "agentcompact.integrations.expand_tools": ["EXPAND_DESCRIPTION", "ExpandTools",
        "SEARCH_DESCRIPTION", "langchain_tools", "llamaindex_tools"],
    "agentcompact.integrations.langgraph": ["CompactionMiddleware", "CompactionNode",
        "LangChainDialect", "ModelCallLogger", "agentcompact_register_dialects",
        "model_call_from_langchain", "pre_model_hook"],
    "agentcompact.integrations.litellm": ["CompactionCallback", "callback"],
    "agentcompact.integrations.llamaindex": ["CompactingLLM", "CompactingMemory",
        "LlamaIndexDialect", "ModelCallLogger", "agentcompact_register_dialects",
        "to_openai_chat"],
    "agentcompact.integrations.openai_agents": ["CompactionFilter", "CompactionHooks"],
    "agentcompact.integrations.proxy": ["CompactionProxy", "DEFAULT_ANTHROPIC_UPSTREAM",
        "DEFAULT_OPENAI_UPSTREAM", "EnginePool", "GatewayConfig", "ProxyApp", "ProxyConfig",
        "RLGateway", "ThreadedServer", "create_app"],
    "agentcompact.integrations.pydantic_ai": ["Compaction", "PydanticAIDialect",
        "agentcompact_register_dialects"],
    "agentcompact.integrations.sdk": ["CompactedClient", "Session", "compact"],
    "agentcompact.plugins": ["get_dialect", "get_plugin_manager", "get_strategy_factory",
        "load_plugins", "new_plugin_manager", "registry"],
    "agentcompact.plugins.recorder": ["EVENTS_FILE", "EVENTS_FORMAT", "Recorder"],
    "agentcompact.plugins.rules": ["MAX_CHARS", "PLUGIN_NAME", "RULE_PATTERN",
        "agentcompact_pin", "is_rule", "typed_text"],
    "agentcompact.replay": ["BASELINES", "CliffCompactionContender", "CompactionRecord",
        "Contender", "ContenderSettings", "EngineContender", "FullHistory", "ItemIndex",
        "LLM_STRATEGIES", "ModelPrice", "PRICES", "RecallCount", "ReplayReport",
        "SALIENT_PATTERNS", "Sent", "SharedCounter", "SlidingWindow", "StrategyRun",
        "TrajectoryReplay", "call_cost", "count_calls", "extract_items", "load_sessions",
        "render_html", "replay", "replay_trajectory", "resolve_price", "write_html"],
    "agentcompact.rl": ["EPISODE_SCHEMA", "LOSS_MODES", "SCHEMA_VERSION", "SEGMENT_SCHEMA",
        "SegmentRowError", "aggregate", "assign_advantages", "assign_gae",
        "broadcast_to_segments", "chain_gae", "drgrpo_advantages", "gae", "grpo_advantages",
        "masked_whiten", "read_rows", "rloo_advantages", "token_weights", "truncated_chain_gae",
        "validate_rows", "weights_for_rows", "write_jsonl", "write_parquet"],
    "agentcompact.rl.adapters": ["VERL_DATA_SOURCE", "VERL_PARQUET_SCHEMA", "require_logprobs",
        "to_skyrl", "to_trl_rollout", "to_trl_sft", "to_verl", "to_verl_parquet"],
    "agentcompact.rl.demo": ["ARMS", "ArmCurve", "DemoConfig", "DemoReport", "plot", "run_demo"],
    "agentcompact.rl.generate": ["TransformersSampler"],
    "agentcompact.rl.logprobs": ["DEFAULT_TOKEN_CHUNK", "DEFAULT_VOCAB_CHUNK", "chosen_logprobs",
        "chosen_logprobs_from_logits", "response_positions"],
    "agentcompact.rl.ppo": ["DUAL_CLIP_C", "OldLogprobs", "collate_step", "policy_loss",
        "policy_loss_from_hidden", "require_rollout_logprobs", "step_normalizer", "surrogate"],
    "agentcompact.rl.recompute": ["LogprobRecomputer", "RECOMPUTED"],
    "agentcompact.rl.rollout": ["CompactingRollout", "Environment", "RolloutSettings", "Sample",
        "Sampler", "SamplingSettings", "Step", "TriggerDraw", "sampling_from", "write_batch"],
    "agentcompact.rl.skyrl": ["CompactingGenerator"],
    "agentcompact.rl.torch_data": ["SegmentDataset", "batch_token_weights", "collate",
        "logprobs_known", "move_to"],
    "agentcompact.rl.trl": ["SegmentGRPOTrainer", "VLLMSampler", "compacting_rollout_func",
        "pad_episodes", "to_trl_episodes", "trl_batch"],
    "agentcompact.rl.verl": ["CompactingAgentLoop", "LOSS_WEIGHTS"],
    "agentcompact.stores": ["Backend", "DEFAULT_STORE_FILE", "SharedPrefixStore",
        "backend_from_url", "check_store_url", "decode_entry", "default_state_dir",
        "default_store_url", "encode_entry", "store_from_url"],
    "agentcompact.strategies": ["CliffLevel", "CliffStrategy", "CompactionRequest",
        "DEFAULT_LEVELS", "DEFAULT_PROMPT", "ParallelStrategy", "Rendered", "Strategy",
        "SummaryStrategy"],
    "agentcompact.testing": ["CLI_BIN_ENV", "CliCommand", "DEFAULT_LOOP_STEPS", "FAULT_HEADER",
        "Fault", "LatencyModel", "RecordedRequest", "Reply", "Responder", "RunningServer",
        "Script", "SimTokenizer", "Step", "Thinking", "ToolCall", "ToolLoop", "ToolLoopModel",
        "UpstreamSim", "claude_command", "codex_command", "create_app", "digest_reply",
        "echo_reply", "estimate_tokens", "filler_text", "find_cli", "gemini_command",
        "last_user_text", "logprob_of", "prompt_text", "prompt_tokens", "serve",
        "tool_loop_script"],
    "agentcompact.trajectory": ["CompactionMark", "DIALECTS", "EpisodeCollector",
        "EpisodeEvents", "EpisodeRows", "FORMATS", "RowBatch", "SampledTokens", "SkipHandler",
        "Trajectory", "UNSUPPORTED_FORMATS", "detect_format", "episode_rows",
        "group_advantages", "group_by_task", "import_trajectories", "iter_trajectories",
        "load", "read_events", "rows_from_events", "tau_bench_groups"],
    "agentcompact.trajectory.export": ["ADVANTAGES", "DEFAULT_MASKED_STOP_REASONS",
        "ExportOptions", "MAX_AUTO_WORKERS", "UNREWARDED", "available_cpus",
        "default_start_method", "export_runs", "iter_export_rows", "read_export",
        "validate_export"],
    "agentcompact.trajectory.ray_export": ["RayEpisodes", "export_runs_ray"],
    "agentcompact.wire": ["ANTHROPIC", "CHAT", "GEMINI", "RESPONSES", "Reassembled",
        "Reassembler", "SSEReader", "SampledTokens", "from_body", "from_chat_chunks",
        "from_chat_completion", "from_responses", "iter_events", "iter_sse", "parse_events",
        "read_chat", "reassemble", "reassemble_events", "reassembler",
        "token_ids_from_bytes"],
}


def _walk(name: str, folder: Path) -> list[tuple[str, Path]]:
    """``(module, source file)`` for the package at ``folder`` and everything under it,
    found on disk (nothing imported)."""
    found = [(name, folder / "__init__.py")]
    for info in pkgutil.iter_modules([str(folder)]):
        child = f"{name}.{info.name}"
        if child in ROOTS:  # a root of its own (another source folder)
            continue
        if info.ispkg:
            found += _walk(child, folder / info.name)
        else:
            found.append((child, folder / f"{info.name}.py"))
    return found


ROOTS = {m.__name__: Path(m.__path__[0])
         for m in (agentcompact, agentcompact.plugins, agentcompact.integrations)}
MODULES = dict(mod for name, folder in ROOTS.items() for mod in _walk(name, folder))


def is_private(module: str) -> bool:
    return any(part.startswith("_") for part in module.split(".")[1:])


def source_all(path: Path) -> list[str] | None:
    """A module's ``__all__`` as its source spells it (None if it has none)."""
    for node in ast.parse(path.read_text()).body:
        targets = (node.targets if isinstance(node, ast.Assign)
                   else [node.target] if isinstance(node, ast.AnnAssign) else [])
        value = getattr(node, "value", None)
        if value is not None and any(getattr(t, "id", None) == "__all__" for t in targets):
            return list(ast.literal_eval(value))
    return None

#: Re-exports across public modules, on purpose: the exception tree lives in
#: ``agentcompact.errors`` and is importable from the top too (as ``httpx.HTTPError``); the
#: RL package re-exports the export error its row checks raise.
REEXPORTS = {
    "agentcompact": {"agentcompact.errors"},
    "agentcompact.rl": {"agentcompact.errors"},
}


def _public() -> list[str]:
    return sorted(m for m in MODULES if not is_private(m) and not m.endswith("__main__"))


def test_every_public_module_is_pinned() -> None:
    assert _public() == sorted(PUBLIC)


@pytest.mark.parametrize("name", sorted(PUBLIC))
def test_all_is_pinned(name: str) -> None:
    names = source_all(MODULES[name])
    assert names is not None, f"{name} has no __all__"
    assert len(names) == len(set(names)), f"{name}.__all__ repeats a name"
    assert sorted(names) == PUBLIC[name], f"{name}.__all__ changed: update PUBLIC on purpose"


def _import(name: str) -> object:
    try:
        return importlib.import_module(name)
    except ImportError as exc:  # a module of an extra that is not installed
        pytest.skip(f"{name}: {exc}")


@pytest.mark.parametrize("name", sorted(PUBLIC))
def test_all_names_exist_and_are_defined_in_the_package(name: str) -> None:
    """Every listed name is there, and a listed class or function comes from the module
    itself or one of the package's private modules (or a re-export in ``REEXPORTS``)."""
    module = _import(name)
    for attr in PUBLIC[name]:
        assert hasattr(module, attr), f"{name}.{attr} is listed but missing"
        value = getattr(module, attr)
        if not (inspect.isclass(value) or inspect.isfunction(value)):
            continue
        origin = value.__module__
        assert (origin == name or (origin.startswith("agentcompact.") and is_private(origin))
                or origin in REEXPORTS.get(name, ())), f"{name}.{attr} comes from {origin}"


def test_private_modules_are_not_listed_in_public_alls() -> None:
    for name, names in PUBLIC.items():
        assert not [n for n in names if n.startswith("_") and not n.startswith("__")], name


def test_the_simulator_runs_under_its_new_name() -> None:
    """The test tool is ``agentcompact.testing``; ``python -m agentcompact.testing`` serves it."""
    assert not (ROOTS["agentcompact.integrations"] / "upstream_sim").exists()
    pytest.importorskip("uvicorn")
    done = subprocess.run([sys.executable, "-m", "agentcompact.testing", "--help"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("usage: python -m agentcompact.testing")


def test_python_m_agentcompact_is_the_command() -> None:
    done = subprocess.run([sys.executable, "-m", "agentcompact", "--help"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("usage: agentcompact")
