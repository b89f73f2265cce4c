"""Record a GRPO group of agent runs (model calls, compactions, outcomes) to
RUN_DIR/events.jsonl for `agentcompact export`. Run against
`python -m agentcompact.testing --script tool-loop`, or set OPENAI_BASE_URL."""

import json
import os
import sys

from openai import OpenAI

from agentcompact import Budget, EpisodeEnd, new_plugin_manager
from agentcompact.integrations.sdk import compact
from agentcompact.plugins.recorder import Recorder

BASE_URL = os.environ.get("OPENAI_BASE_URL", "http://127.0.0.1:8090/v1")
RUN_DIR = sys.argv[1] if len(sys.argv) > 1 else "runs/demo"
TOOLS = [{"type": "function", "function": {
    "name": "read_file", "description": "Read a file.",
    "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}}]

pm = new_plugin_manager()
recorder = Recorder(RUN_DIR, metadata={"model": "gpt-4o-mini", "sampling": {"temperature": 1}})
pm.register(recorder)

with OpenAI(base_url=BASE_URL, api_key=os.environ.get("OPENAI_API_KEY", "x")) as raw:
    client = compact(raw, budget=Budget(trigger_tokens=2000), plugins=pm, group_id="fix-the-bug")
    for k in range(4):  # one GRPO group: four tries at the same task
        client.episode_id = f"fix-the-bug-{k}"
        messages = [{"role": "user", "content": "Find and fix the bug."}]
        while True:
            message = client.chat.completions.create(
                model="gpt-4o-mini", messages=messages, tools=TOOLS).choices[0].message
            messages.append(message)
            if not message.tool_calls:
                break
            for call in message.tool_calls:
                path = json.loads(call.function.arguments or "{}").get("path", "?")
                messages.append({"role": "tool", "tool_call_id": call.id,
                                 "content": f"# {path}\n" + "def f(x):\n    return x * 2\n" * 60})
        # your harness scores each try and reports the outcome
        pm.hook.agentcompact_log_episode_end(episode=EpisodeEnd(
            episode_id=client.episode_id, reward=float(k % 2), stop_reason="complete",
            group_id="fix-the-bug", sample_index=k))
recorder.close()

with open(os.path.join(RUN_DIR, "events.jsonl")) as log:
    kinds = [json.loads(line)["kind"] for line in log]
print(f"{RUN_DIR}/events.jsonl: {kinds.count('model_call')} model calls, "
      f"{kinds.count('compaction')} compactions, {kinds.count('episode_end')} episodes")
assert kinds.count("compaction") > 0
