"""The expand tools for agents: ``expand(handle)`` and ``search_dropped(query)``.

The cliff strategy leaves a skim line with a handle (``expand ac-3f9ac01b22de``) for every
part it drops or truncates, and writes the original into its archive. These tools let the
agent get the original back, verbatim, instead of re-running the tool:

* :func:`langchain_tools` — LangChain ``StructuredTool`` objects (``bind_tools``, LangGraph
  ``ToolNode`` / ``create_react_agent``); extra ``langgraph``;
* :func:`llamaindex_tools` — LlamaIndex ``FunctionTool`` objects; extra ``llamaindex``;
* :class:`ExpandTools` — for the SDK wrappers and any other loop: the tool schemas in the
  OpenAI Chat, OpenAI Responses and Anthropic formats, and :meth:`ExpandTools.call`, which
  runs a tool call by name and returns its text.

Pass the archive the engine's strategy writes to: ``engine.strategy.archive`` (a
``MemoryArchive`` by default) or the same path given as
``strategy=StrategySettings("cliff", options={"archive": path})``. The MCP server
(``agentcompact mcp``) serves the same two tools from a file.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from agentcompact import Archive, expand_text, open_archive
from agentcompact.extending import DEFAULT_PAGE_CHARS, search_text

from ..errors import ConfigError

__all__ = [
    "EXPAND_DESCRIPTION",
    "SEARCH_DESCRIPTION",
    "ExpandTools",
    "langchain_tools",
    "llamaindex_tools",
]

EXPAND_DESCRIPTION = (
    "Return the original text of a part of the conversation that context compaction "
    "dropped or truncated, verbatim. Pass the handle shown in the compaction message "
    "(e.g. 'ac-3f9ac01b22de'); long originals come in pages: pass the offset the previous "
    "page names to get the next one."
)
SEARCH_DESCRIPTION = (
    "Search the originals that context compaction dropped or truncated for a string "
    "(case-insensitive); returns the handle, the skim line and an excerpt of each match."
)

_EXPAND_PARAMS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "handle": {"type": "string", "description": "the handle, e.g. ac-3f9ac01b22de"},
        "offset": {"type": "integer", "minimum": 0, "default": 0,
                   "description": "character offset of the page (0: the start)"},
    },
    "required": ["handle"],
    "additionalProperties": False,
}
_SEARCH_PARAMS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "query": {"type": "string", "description": "text to find, e.g. an error message"},
        "limit": {"type": "integer", "minimum": 1, "maximum": 50, "default": 10},
    },
    "required": ["query"],
    "additionalProperties": False,
}


def _archive(archive: Any) -> Archive:
    found = open_archive(archive) if archive is not None else None
    if found is None:
        raise ConfigError("the expand tools need an archive: an Archive object or the path "
                          "of an archive file (engine.strategy.archive)")
    return found


@dataclass
class ExpandTools:
    """The two tools for a hand-written agent loop (OpenAI or Anthropic SDK).

    >>> tools = ExpandTools(engine.strategy.archive)              # doctest: +SKIP
    >>> client.chat.completions.create(..., tools=tools.openai_chat())  # doctest: +SKIP
    >>> text = tools.call(call.function.name, call.function.arguments)  # doctest: +SKIP
    """

    archive: Any
    page_chars: int = DEFAULT_PAGE_CHARS

    def __post_init__(self) -> None:
        self.archive = _archive(self.archive)

    names = ("expand", "search_dropped")

    def openai_chat(self) -> list[dict[str, Any]]:
        """Tool definitions for Chat Completions (``tools=``)."""
        return [{"type": "function", "function": {"name": name, "description": desc,
                                                  "parameters": params}}
                for name, desc, params in self._specs()]

    def openai_responses(self) -> list[dict[str, Any]]:
        """Tool definitions for the Responses API (``tools=``)."""
        return [{"type": "function", "name": name, "description": desc,
                 "parameters": params} for name, desc, params in self._specs()]

    def anthropic(self) -> list[dict[str, Any]]:
        """Tool definitions for the Anthropic Messages API (``tools=``)."""
        return [{"name": name, "description": desc, "input_schema": params}
                for name, desc, params in self._specs()]

    def _specs(self) -> list[tuple[str, str, dict[str, Any]]]:
        return [("expand", EXPAND_DESCRIPTION, _EXPAND_PARAMS),
                ("search_dropped", SEARCH_DESCRIPTION, _SEARCH_PARAMS)]

    def handles(self, name: str) -> bool:
        """True when ``name`` is one of these tools."""
        return name in self.names

    def call(self, name: str, arguments: str | dict[str, Any] | None) -> str:
        """Run one tool call; ``arguments`` as JSON text (OpenAI) or a dict (Anthropic).

        Bad arguments give a one-line ``[agentcompact …]`` answer the model can read,
        never an exception in the agent's loop.
        """
        try:
            args = json.loads(arguments) if isinstance(arguments, str) else dict(arguments or {})
        except (ValueError, TypeError):
            return f"[agentcompact {name}: the arguments are not a JSON object]"
        if not isinstance(args, dict):
            return f"[agentcompact {name}: the arguments are not a JSON object]"
        if name == "expand":
            offset = args.get("offset", 0)
            if not isinstance(args.get("handle"), str) or not isinstance(offset, int):
                return "[agentcompact expand: needs handle (string) and offset (integer)]"
            return expand_text(self.archive, args["handle"], offset, self.page_chars)
        if name == "search_dropped":
            limit = args.get("limit", 10)
            if not isinstance(args.get("query"), str) or not isinstance(limit, int):
                return "[agentcompact search_dropped: needs query (string), limit (integer)]"
            return search_text(self.archive, args["query"], limit)
        return f"[agentcompact: no tool named {name!r}; the tools are expand, search_dropped]"


def _functions(archive: Any, page_chars: int) -> tuple[Callable[..., str], Callable[..., str]]:
    """``expand`` and ``search_dropped`` as typed functions (frameworks read the signature
    and docstring to build the tool's schema)."""
    tools = ExpandTools(archive, page_chars)

    def expand(handle: str, offset: int = 0) -> str:
        return tools.call("expand", {"handle": handle, "offset": offset})

    def search_dropped(query: str, limit: int = 10) -> str:
        return tools.call("search_dropped", {"query": query, "limit": limit})

    return expand, search_dropped


def langchain_tools(archive: Any, page_chars: int = DEFAULT_PAGE_CHARS) -> list[Any]:
    """``expand`` and ``search_dropped`` as LangChain ``StructuredTool`` objects."""
    from langchain_core.tools import StructuredTool

    expand, search_dropped = _functions(archive, page_chars)
    return [StructuredTool.from_function(expand, name="expand",
                                         description=EXPAND_DESCRIPTION),
            StructuredTool.from_function(search_dropped, name="search_dropped",
                                         description=SEARCH_DESCRIPTION)]


def llamaindex_tools(archive: Any, page_chars: int = DEFAULT_PAGE_CHARS) -> list[Any]:
    """``expand`` and ``search_dropped`` as LlamaIndex ``FunctionTool`` objects."""
    from llama_index.core.tools import FunctionTool

    expand, search_dropped = _functions(archive, page_chars)
    return [FunctionTool.from_defaults(fn=expand, name="expand",
                                       description=EXPAND_DESCRIPTION),
            FunctionTool.from_defaults(fn=search_dropped, name="search_dropped",
                                       description=SEARCH_DESCRIPTION)]
