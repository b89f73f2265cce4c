"""A LlamaIndex `FunctionAgent` whose every LLM call is bounded by `memory.wrap(llm)`.
Run against `python -m agentcompact.testing --script tool-loop`, or set OPENAI_BASE_URL."""

import asyncio
import os

from llama_index.core.agent.workflow import FunctionAgent
from llama_index.llms.openai_like import OpenAILike

from agentcompact import Budget, hookimpl, new_plugin_manager
from agentcompact.integrations.llamaindex import CompactingMemory

BASE_URL = os.environ.get("OPENAI_BASE_URL", "http://127.0.0.1:8090/v1")


def read_file(path: str) -> str:
    """Read a file of the repository."""
    return f"# {path}\n" + "def f(x):\n    return x * 2\n" * 60


class PrintCompactions:
    @hookimpl
    def agentcompact_on_compaction(self, event):
        print(f"compaction: {event.tokens_before:,} -> {event.tokens_after:,} tokens")


async def main() -> None:
    pm = new_plugin_manager()
    pm.register(PrintCompactions())
    llm = OpenAILike(model="gpt-4o-mini", api_base=BASE_URL,
                     api_key=os.environ.get("OPENAI_API_KEY", "x"),
                     is_chat_model=True, is_function_calling_model=True)
    memory = CompactingMemory(budget=Budget(trigger_tokens=2000), plugins=pm,
                              episode_id="episode-1", group_id="fix-the-bug")
    compacting = memory.wrap(llm)
    agent = FunctionAgent(tools=[read_file], llm=compacting,
                          system_prompt="You are a careful coder.")
    with memory.logger:  # logs every LLM call for RL export
        for task in ("Find the bug.", "Fix it."):
            print(await agent.run(task, memory=memory))
    last = compacting.last_result
    print(f"memory: {len(memory.get_all())} messages; the last call sent "
          f"{last.tokens_after:,} of {last.tokens_original:,} tokens")
    assert last.tokens_after <= 2000 < last.tokens_original


asyncio.run(main())
