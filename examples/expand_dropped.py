"""Get back what compaction left out: `search_dropped` finds an archived original by
content, `expand` returns it verbatim (ExpandTools hands both to the agent). Run against
`python -m agentcompact.testing --script tool-loop`, or set OPENAI_BASE_URL."""

import json
import os
import tempfile

from openai import OpenAI

from agentcompact import Budget, StrategySettings, expand, open_archive, search_dropped
from agentcompact.integrations.expand_tools import ExpandTools
from agentcompact.integrations.sdk import compact

BASE_URL = os.environ.get("OPENAI_BASE_URL", "http://127.0.0.1:8090/v1")
READ_FILE = {"type": "function", "function": {
    "name": "read_file", "description": "Read a file.",
    "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}}

archive = open_archive(os.path.join(tempfile.mkdtemp(), "archive.sqlite"))
tools = ExpandTools(archive)  # expand / search_dropped, as tools the model may call

with OpenAI(base_url=BASE_URL, api_key=os.environ.get("OPENAI_API_KEY", "x")) as raw:
    client = compact(raw, budget=Budget(trigger_tokens=2000),
                     strategy=StrategySettings("cliff", options={"archive": archive}))
    messages = [{"role": "user", "content": "Find the bug."}]
    while True:
        message = client.chat.completions.create(
            model="gpt-4o-mini", messages=messages,
            tools=[READ_FILE, *tools.openai_chat()]).choices[0].message
        messages.append(message)
        if not message.tool_calls:
            break
        for call in message.tool_calls:
            if tools.handles(call.function.name):  # the model asked for an original
                output = tools.call(call.function.name, call.function.arguments)
            else:
                path = json.loads(call.function.arguments).get("path", "?")
                output = f"# {path}\n" + "def f(x):\n    return x * 2\n" * 60
            messages.append({"role": "tool", "tool_call_id": call.id, "content": output})

hits = search_dropped(archive, "# src/module_0.py")  # the first file the agent read
print(f"dropped and archived: {hits[0].skim}")
page = expand(archive, hits[0].handle)
print(f"expand('{hits[0].handle}'): {page.total:,} characters, verbatim:")
print(page.text[:70])
assert page.text.startswith("# src/module_0.py")
