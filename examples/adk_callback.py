"""Google ADK: every LlmRequest of an agent bounded by agentcompact's before_model_callback.

Runs offline as written: a local stand-in model (agentcompact.testing), reached through
ADK's LiteLlm client, calls a ``read_file`` tool 30 times. For a real model, give
``LlmAgent`` your model (``model="gemini-2.5-flash"``) instead of the stand-in.
"""

import asyncio
import os

from agentcompact import Budget

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no price-list download

from google.adk.agents import LlmAgent
from google.adk.models.lite_llm import LiteLlm
from google.adk.runners import Runner
from google.adk.sessions import InMemorySessionService
from google.genai import types

from agentcompact.integrations.adk import CompactionCallback
from agentcompact.testing import Reply, Script, UpstreamSim, serve

STEPS, TRIGGER = 30, 4000


def stand_in(request):
    """The stand-in model: read step files one by one, then answer."""
    results = [m["content"] for m in request["messages"] if m["role"] == "tool"]
    step = int(results[-1].split("STEP ")[1].split()[0]) + 1 if results else 1
    if step > STEPS:
        return Reply("All steps read.")
    return Reply.tool("read_file", {"path": f"step_{step}.txt"})


def read_file(path: str) -> str:
    """Read a file of the repository."""
    step = path.split("_")[1].split(".")[0]
    return f"STEP {step} of the log\n" + "build output line\n" * 150


async def main(api_base):
    callback = CompactionCallback(budget=Budget(trigger_tokens=TRIGGER))
    agent = LlmAgent(name="engineer", instruction="You are a careful engineer.",
                     model=LiteLlm(model="openai/sim-model", api_base=api_base,
                                   api_key="sk-local"),
                     tools=[read_file], before_model_callback=callback)
    sessions = InMemorySessionService()
    runner = Runner(app_name="example", agent=agent, session_service=sessions)
    session = await sessions.create_session(app_name="example", user_id="me")
    task = types.Content(role="user", parts=[types.Part(text="Read the step files.")])
    answer = ""
    async for event in runner.run_async(user_id="me", session_id=session.id,
                                        new_message=task):
        if event.is_final_response() and event.content and event.content.parts:
            answer = event.content.parts[0].text
    return answer, callback


with serve(UpstreamSim(Script(then=stand_in))) as server:
    answer, callback = asyncio.run(main(f"{server.base_url}/v1"))

print(answer)
print(f"{len(server.requests)} model calls, last request "
      f"{callback.last_result.tokens_after} tokens (trigger {TRIGGER})")
