"""PydanticAI: every model request of an agent run bounded by agentcompact's capability.

Runs offline as written: a local stand-in model (agentcompact.testing) plays the chat
completions API and calls a ``read_file`` tool 30 times. For a real model, give ``Agent``
your model name (``"openai:gpt-5.2"``) instead of the stand-in.
"""

import asyncio

from openai import AsyncOpenAI
from pydantic_ai import Agent
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider

from agentcompact import Budget
from agentcompact.integrations.pydantic_ai import Compaction
from agentcompact.testing import Reply, Script, UpstreamSim, serve

STEPS, TRIGGER = 30, 4000


def stand_in(request):
    """The stand-in model: read step files one by one, then answer."""
    results = [m["content"] for m in request["messages"] if m["role"] == "tool"]
    step = int(results[-1].split()[1]) + 1 if results else 1
    if step > STEPS:
        return Reply("All steps read.")
    return Reply.tool("read_file", {"path": f"step_{step}.txt"})


async def main(base_url):
    compaction = Compaction(budget=Budget(trigger_tokens=TRIGGER))
    async with AsyncOpenAI(base_url=base_url, api_key="sk-local") as client:
        model = OpenAIChatModel("sim-model", provider=OpenAIProvider(openai_client=client))
        agent = Agent(model, instructions="You are a careful engineer.",
                      capabilities=[compaction])

        @agent.tool_plain
        def read_file(path: str) -> str:
            """Read a file of the repository."""
            step = path.split("_")[1].split(".")[0]
            return f"STEP {step} of the log\n" + "build output line\n" * 150

        result = await agent.run("Read the step files.")
    return result, compaction


with serve(UpstreamSim(Script(then=stand_in))) as server:
    result, compaction = asyncio.run(main(f"{server.base_url}/v1"))

print(result.output)
# the run keeps its whole history; only what each request sent was compacted
print(f"{len(server.requests)} model calls, last request "
      f"{compaction.last_result.tokens_after} tokens (trigger {TRIGGER}); "
      f"history of {len(result.all_messages())} messages")
