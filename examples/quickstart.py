"""The engine on its own: an Anthropic SDK tool loop that compacts its history before
every call. Run against `python -m agentcompact.testing --script tool-loop`, or set
ANTHROPIC_BASE_URL."""

import os

from anthropic import Anthropic

from agentcompact import Budget, Engine

client = Anthropic(base_url=os.environ.get("ANTHROPIC_BASE_URL", "http://127.0.0.1:8090"),
                   api_key=os.environ.get("ANTHROPIC_API_KEY", "x"))
engine = Engine(strategy="cliff", dialect="anthropic", budget=Budget(trigger_tokens=2000))
tools = [{"name": "read_file", "description": "Read a file.",
          "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}}}]
history = [{"role": "user", "content": "Find the bug in src/."}]

while True:
    result = engine.compact(history)  # your history is never mutated
    print(f"{result.tokens_original:>6,} tokens of history -> {result.tokens_after:>5,} sent"
          + ("  (compacted)" if result.compacted else ""))
    reply = client.messages.create(model="claude-sonnet-4-5", max_tokens=1024, tools=tools,
                                   messages=result.messages)
    history.append({"role": "assistant", "content": [b.model_dump(exclude_none=True)
                                                    for b in reply.content]})
    calls = [b for b in reply.content if b.type == "tool_use"]
    if not calls:
        break
    history.append({"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": call.id,
         "content": f"# {call.input['path']}\n" + "def f(x):\n    return x * 2\n" * 60}
        for call in calls]})

assert result.tokens_after <= 2000 < result.tokens_original
