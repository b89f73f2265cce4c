"""LiteLLM: every request bounded by agentcompact's CustomLogger callback.

Runs offline as written: a local stand-in model (agentcompact.testing) plays the provider and
calls a ``read_file`` tool 30 times. For a real model, drop the stand-in and give
``litellm.acompletion`` your own model name (and key).
"""

import asyncio
import json
import os

from agentcompact import Budget

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no price-list download

import litellm

from agentcompact.integrations.litellm import CompactionCallback
from agentcompact.testing import Reply, Script, UpstreamSim, serve

STEPS, TRIGGER = 30, 4000


def stand_in(request):
    """The stand-in model: read step files one by one, then answer."""
    results = [m["content"] for m in request["messages"] if m["role"] == "tool"]
    step = int(results[-1].split()[1]) + 1 if results else 1
    if step > STEPS:
        return Reply("All steps read.")
    return Reply.tool("read_file", {"path": f"step_{step}.txt"})


def read_file(path):
    step = path.split("_")[1].split(".")[0]
    return f"STEP {step} of the log\n" + "build output line\n" * 150


async def main(api_base):
    callback = CompactionCallback(budget=Budget(trigger_tokens=TRIGGER))
    litellm.callbacks = [callback]  # every acompletion / Router call is compacted
    tools = [{"type": "function", "function": {
        "name": "read_file", "description": "Read a file.",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}}]
    messages = [{"role": "system", "content": "You are a careful engineer."},
                {"role": "user", "content": "Read the step files."}]
    sizes = []  # tokens sent per call (messages, system prompt and tools)
    while True:
        reply = await litellm.acompletion(model="openai/sim-model", api_base=api_base,
                                          api_key="sk-local", messages=messages, tools=tools)
        sizes.append(callback.last_result.tokens_after)
        message = reply.choices[0].message
        if not message.tool_calls:
            return message.content, sizes
        messages.append(message.model_dump(exclude_none=True))
        for call in message.tool_calls:
            path = json.loads(call.function.arguments)["path"]
            messages.append({"role": "tool", "tool_call_id": call.id,
                             "content": read_file(path)})


with serve(UpstreamSim(Script(then=stand_in))) as server:
    answer, sizes = asyncio.run(main(f"{server.base_url}/v1"))

print(answer)
print(f"{len(sizes)} model calls, largest request {max(sizes)} tokens (trigger {TRIGGER})")
