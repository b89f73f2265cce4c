"""A LangChain `create_agent` agent compacted by `CompactionMiddleware`; the state keeps
the full history. Run against `python -m agentcompact.testing --script tool-loop`, or set
OPENAI_BASE_URL."""

import os

from langchain.agents import create_agent
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.checkpoint.memory import InMemorySaver

from agentcompact import Budget, hookimpl, new_plugin_manager
from agentcompact.integrations.langgraph import CompactionMiddleware

BASE_URL = os.environ.get("OPENAI_BASE_URL", "http://127.0.0.1:8090/v1")


@tool
def read_file(path: str) -> str:
    """Read a file of the repository."""
    return f"# {path}\n" + "def f(x):\n    return x * 2\n" * 60


class PrintCompactions:
    @hookimpl
    def agentcompact_on_compaction(self, event):
        print(f"compaction: {event.tokens_before:,} -> {event.tokens_after:,} tokens")


pm = new_plugin_manager()
pm.register(PrintCompactions())
middleware = CompactionMiddleware(budget=Budget(trigger_tokens=2000), plugins=pm,
                                  episode_id="episode-1", group_id="fix-the-bug")
model = ChatOpenAI(model="gpt-4o-mini", base_url=BASE_URL,
                   api_key=os.environ.get("OPENAI_API_KEY", "x"))
agent = create_agent(model, [read_file], system_prompt="You are a careful coder.",
                     middleware=[middleware], checkpointer=InMemorySaver())

config = {"configurable": {"thread_id": "thread-1"}, "recursion_limit": 50}
agent.invoke({"messages": [{"role": "user", "content": "Find the bug."}]}, config)
state = agent.invoke({"messages": [{"role": "user", "content": "Now fix it."}]}, config)

last = middleware.last_result
print(f"state keeps {len(state['messages'])} messages; the last model call sent "
      f"{last.tokens_after:,} of {last.tokens_original:,} tokens (system prompt and tools "
      f"included)")
assert last.tokens_after <= 2000 < last.tokens_original
