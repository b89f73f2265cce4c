"""OpenAI Agents SDK: every model call of a run bounded by agentcompact's input filter.

Runs offline as written: a local stand-in model (agentcompact.testing) plays the Responses
API and calls a ``read_file`` tool 30 times. For a real model, drop the stand-in and the
``model=`` argument: the agent then uses your ``OPENAI_API_KEY``.
"""

import asyncio

from agents import (
    Agent,
    OpenAIResponsesModel,
    RunConfig,
    Runner,
    function_tool,
    set_tracing_disabled,
)
from openai import AsyncOpenAI

from agentcompact import Budget
from agentcompact.integrations.openai_agents import CompactionFilter
from agentcompact.testing import Reply, Script, UpstreamSim, serve

STEPS, TRIGGER = 30, 4000
set_tracing_disabled(True)  # the stand-in is local: nothing to export traces to


def stand_in(request):
    """The stand-in model: read step files one by one, then answer."""
    results = [i["output"] for i in request["input"] if i.get("type") == "function_call_output"]
    step = int(results[-1].split()[1]) + 1 if results else 1
    if step > STEPS:
        return Reply("All steps read.")
    return Reply.tool("read_file", {"path": f"step_{step}.txt"})


@function_tool
def read_file(path: str) -> str:
    """Read a file of the repository."""
    step = path.split("_")[1].split(".")[0]
    return f"STEP {step} of the log\n" + "build output line\n" * 150


async def main(base_url):
    compaction = CompactionFilter(budget=Budget(trigger_tokens=TRIGGER))
    async with AsyncOpenAI(base_url=base_url, api_key="sk-local") as client:
        agent = Agent(name="engineer", instructions="You are a careful engineer.",
                      tools=[read_file],
                      model=OpenAIResponsesModel(model="sim-model", openai_client=client))
        result = await Runner.run(agent, "Read the step files.", max_turns=STEPS + 5,
                                  run_config=RunConfig(call_model_input_filter=compaction))
    return result.final_output, compaction


with serve(UpstreamSim(Script(then=stand_in))) as server:
    answer, compaction = asyncio.run(main(f"{server.base_url}/v1"))

print(answer)
print(f"{len(server.requests)} model calls, last request "
      f"{compaction.last_result.tokens_after} tokens (trigger {TRIGGER})")
