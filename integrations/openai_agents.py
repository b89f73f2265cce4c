"""OpenAI Agents SDK integration: a ``RunConfig.call_model_input_filter`` that bounds every
model call of a ``Runner.run`` / ``Runner.run_streamed``.

Install with ``pip install agentcompact[openai-agents]``. One line::

    compaction = CompactionFilter(budget=Budget(trigger_tokens=60000))
    result = await Runner.run(agent, task, run_config=RunConfig(
        call_model_input_filter=compaction), hooks=compaction.hooks)

The SDK calls the filter just before each model call — every step of the tool loop, after a
handoff (the new agent's instructions and tools), streamed or not — with the input items
it is about to send; the filter returns them compacted (``openai_responses`` items, whatever
the model class: the chat-completions model converts them after). The budget counts the
items, the agent's instructions and its tool schemas (function tools, MCP tools, hosted
tools, and the handoffs the model sees as tools). A session (``SQLiteSession``…) keeps the
full history: only what the model sees is compacted.

One engine per conversation (LRU-bounded), the conversation being the digest of its root
(the items up to the first user message); between compactions the compacted prefix is
byte-identical from call to call. ``hooks`` (a ``RunHooks``) logs each model call through
``agentcompact_log_model_call`` with the items sent and the response items.
"""

from __future__ import annotations

import logging
import operator
from collections.abc import Sequence
from typing import Any

import pluggy
from agents import Agent, FunctionTool, Handoff, RunContextWrapper, RunHooks, handoff
from agents.items import ModelResponse
from agents.run import CallModelData, ModelInputData

from agentcompact import (
    CompactionResult,
    ConfigError,
    Engine,
    ModelCall,
    get_dialect,
    log_model_call,
)

from ._hosts import Conversations, conversation_key
from ._requests import json_safe

__all__ = ["CompactionFilter", "CompactionHooks"]

log = logging.getLogger("agentcompact.openai_agents")

_DIALECT = "openai_responses"
_PENDING_CALLS = 4096  # model calls awaiting their on_llm_end (runs in flight)


def _plain(item: Any) -> Any:
    dump = getattr(item, "model_dump", None)
    return dump(mode="json", exclude_unset=True) if callable(dump) else item


def _tool_schema(tool: Any) -> Any:
    """A tool as the Responses API receives it (what its tokens are counted from)."""
    if isinstance(tool, FunctionTool):
        return {"type": "function", "name": tool.name, "description": tool.description,
                "parameters": tool.params_json_schema, "strict": tool.strict_json_schema}
    if isinstance(tool, Handoff):
        return {"type": "function", "name": tool.tool_name,
                "description": tool.tool_description, "parameters": tool.input_json_schema,
                "strict": tool.strict_json_schema}
    # a hosted tool (web search, file search, computer…): its settings, as JSON
    return json_safe(getattr(tool, "__dict__", None) or repr(tool))


class _AgentTools:
    """The tool schemas of the last agent seen, by the identity of its tools (an agent's
    tools are the same objects from call to call)."""

    def __init__(self) -> None:
        self._last: tuple[tuple[Any, ...], list[Any]] | None = None

    async def __call__(self, agent: Agent[Any], context: Any) -> list[Any]:
        tools = await agent.get_all_tools(RunContextWrapper(context))
        handoffs = list(agent.handoffs)
        key = (*tools, *handoffs)
        last = self._last
        if last is not None and len(last[0]) == len(key) and all(map(operator.is_, last[0], key)):
            return last[1]
        schemas = [_tool_schema(t) for t in tools]
        schemas += [_tool_schema(h if isinstance(h, Handoff) else handoff(h)) for h in handoffs]
        self._last = (key, schemas)
        return schemas


class CompactionFilter:
    """A ``call_model_input_filter`` compacting what each model call receives (see the
    module docstring). Async: the SDK awaits it.

    :param engine: an :class:`~agentcompact.Engine` of dialect ``openai_responses`` whose
        settings each conversation's engine copies; or leave it out and give
        ``budget=Budget(trigger_tokens=...)`` (and any other ``Engine``
        option), checked here.
    :param max_conversations: conversations whose engine is kept (LRU).
    :param plugins: the plugin manager for engines and logging (default: the global one).
    """

    def __init__(self, engine: Engine | None = None, *, max_conversations: int = 256,
                 plugins: pluggy.PluginManager | None = None, **engine_kwargs: Any) -> None:
        if engine is not None and engine.dialect.name != _DIALECT:
            raise ConfigError(f"CompactionFilter: engine dialect is {engine.dialect.name!r}; "
                              f"it must be {_DIALECT!r} (the SDK's input items)")
        self.conversations = Conversations(get_dialect(_DIALECT), engine_kwargs, engine=engine,
                                           plugins=plugins, owner="CompactionFilter",
                                           max_conversations=max_conversations)
        self.last_result: CompactionResult | None = None
        self.hooks = CompactionHooks(self)
        self._tools = _AgentTools()

    async def __call__(self, data: CallModelData[Any]) -> ModelInputData:
        items = [_plain(item) for item in data.model_data.input]
        instructions = data.model_data.instructions
        body: dict[str, Any] = {"tools": await self._tools(data.agent, data.context)}
        if instructions:
            body["instructions"] = instructions
        dialect = self.conversations.dialect
        engine = self.conversations.get(conversation_key(dialect, items))
        result = await engine.acompact(items, fixed_tokens=engine.fixed_tokens(body))
        self.last_result = result
        if not result.modified:
            return data.model_data
        return ModelInputData(input=list(result.messages), instructions=instructions)


class CompactionHooks(RunHooks[Any]):
    """``RunHooks`` logging each model call through ``agentcompact_log_model_call``: the
    items the model received (after the filter) and its output items. Pass them as
    ``Runner.run(..., hooks=compaction.hooks)``."""

    def __init__(self, owner: CompactionFilter) -> None:
        self._owner = owner
        self._sent: dict[int, tuple[str, list[Any], str | None]] = {}

    async def on_llm_start(self, context: RunContextWrapper[Any], agent: Agent[Any],
                           system_prompt: str | None, input_items: Sequence[Any]) -> None:
        items = [_plain(i) for i in input_items]
        key = conversation_key(self._owner.conversations.dialect, items)
        if len(self._sent) >= _PENDING_CALLS:  # calls that failed never reach on_llm_end
            self._sent.clear()
        self._sent[id(context)] = (key, items, system_prompt)

    async def on_llm_end(self, context: RunContextWrapper[Any], agent: Agent[Any],
                         response: ModelResponse) -> None:
        sent = self._sent.pop(id(context), None)
        if sent is None:
            return
        key, items, instructions = sent
        try:
            usage = response.usage
            call = ModelCall(
                episode_id=key, dialect=_DIALECT, messages=json_safe(items),
                response=json_safe(list(response.output)),
                request={"instructions": instructions} if instructions else {},
                usage={"input_tokens": usage.input_tokens, "output_tokens": usage.output_tokens},
                model=str(agent.model) if isinstance(agent.model, str) else None,
                compacted=any(self._owner.conversations.dialect.is_synthetic(i) for i in items))
            log_model_call(call, self._owner.conversations.plugins)
        except Exception as exc:  # a recording failure never reaches the run
            log.error("agentcompact: recording an Agents SDK call failed: %s",
                      type(exc).__name__)
