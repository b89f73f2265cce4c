"""The summary strategy: an LLM summary replaces the compacted span (here the simulated
provider summarizes too: a request without tools gets a digest of its prompt). Run against
`python -m agentcompact.testing --script tool-loop`, or set OPENAI_BASE_URL."""

import json
import os

from openai import OpenAI

from agentcompact import Budget, StrategySettings, hookimpl, new_plugin_manager
from agentcompact.integrations.sdk import compact

BASE_URL = os.environ.get("OPENAI_BASE_URL", "http://127.0.0.1:8090/v1")
TOOLS = [{"type": "function", "function": {
    "name": "read_file", "description": "Read a file.",
    "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}}]


class PrintCompactions:
    summaries = []

    @hookimpl
    def agentcompact_on_compaction(self, event):
        print(f"{event.strategy} compaction: {event.tokens_before:,} -> "
              f"{event.tokens_after:,} tokens" + (f" (fell back: {event.error})"
                                                  if event.error else ""))

    @hookimpl
    def agentcompact_log_summary_call(self, call):  # each summarizer request
        self.summaries.append(call.output)


pm = new_plugin_manager()
pm.register(PrintCompactions())
with OpenAI(base_url=BASE_URL, api_key=os.environ.get("OPENAI_API_KEY", "x")) as raw:
    client = compact(raw, budget=Budget(trigger_tokens=2000), plugins=pm,
                     strategy=StrategySettings("summary", base_url=BASE_URL, model="gpt-4o-mini",
                                               api_key=os.environ.get("OPENAI_API_KEY", "x")))
    messages = [{"role": "user", "content": "Find the bug."}]
    while True:
        message = client.chat.completions.create(
            model="gpt-4o-mini", messages=messages, tools=TOOLS).choices[0].message
        messages.append(message)
        if not message.tool_calls:
            break
        for call in message.tool_calls:
            path = json.loads(call.function.arguments).get("path", "?")
            messages.append({"role": "tool", "tool_call_id": call.id,
                             "content": f"# {path}\n" + "def f(x):\n    return x * 2\n" * 60})
print(f"the latest summary, sent instead of the turns it covers:\n"
      f"{PrintCompactions.summaries[-1][:150]}")
assert PrintCompactions.summaries
