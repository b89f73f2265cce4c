"""An OpenAI SDK tool loop behind `compact(client)`: every call sends the compacted
context (and is logged for RL export when a recorder is registered: examples/rl_record.py).
Run against `python -m agentcompact.testing --script tool-loop`, or set OPENAI_BASE_URL."""

import json
import os

from openai import OpenAI

from agentcompact import Budget, hookimpl, new_plugin_manager
from agentcompact.integrations.sdk import compact

BASE_URL = os.environ.get("OPENAI_BASE_URL", "http://127.0.0.1:8090/v1")
TOOLS = [{"type": "function", "function": {
    "name": "read_file", "description": "Read a file.",
    "parameters": {"type": "object", "properties": {"path": {"type": "string"}},
                   "required": ["path"]}}}]


class PrintCompactions:
    @hookimpl
    def agentcompact_on_compaction(self, event):
        print(f"compaction: {event.tokens_before:,} -> {event.tokens_after:,} tokens")


pm = new_plugin_manager()
pm.register(PrintCompactions())
with OpenAI(base_url=BASE_URL, api_key=os.environ.get("OPENAI_API_KEY", "x")) as raw:
    client = compact(raw, budget=Budget(trigger_tokens=2000), plugins=pm, episode_id="episode-1")
    messages = [{"role": "system", "content": "You are a careful coder."},
                {"role": "user", "content": "Find and fix the bug."}]
    while True:
        message = client.chat.completions.create(
            model="gpt-4o-mini", messages=messages, tools=TOOLS).choices[0].message
        messages.append(message)  # the full history stays yours
        if not message.tool_calls:
            break
        for call in message.tool_calls:
            path = json.loads(call.function.arguments or "{}").get("path", "?")
            messages.append({"role": "tool", "tool_call_id": call.id,
                             "content": f"# {path}\n" + "def f(x):\n    return x * 2\n" * 60})
print(f"history: {len(messages)} messages, all kept by you")
