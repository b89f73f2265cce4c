"""Any client, unchanged, behind the proxy: a standard-library tool loop that sends its
whole history on every call. Run it as `agentcompact run --trigger 2000 --openai-upstream
http://127.0.0.1:8090 -- python examples/proxy_client.py`, against
`python -m agentcompact.testing --script tool-loop`."""

import json
import os
import urllib.request

BASE_URL = os.environ.get("OPENAI_BASE_URL", "http://127.0.0.1:8719/v1")
TOOLS = [{"type": "function", "function": {
    "name": "read_file", "description": "Read a file.",
    "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}}]


def chat(messages: list) -> dict:
    body = json.dumps({"model": "gpt-4o-mini", "messages": messages, "tools": TOOLS}).encode()
    request = urllib.request.Request(f"{BASE_URL}/chat/completions", data=body, headers={
        "content-type": "application/json",
        "authorization": f"Bearer {os.environ.get('OPENAI_API_KEY', 'x')}"})
    with urllib.request.urlopen(request) as answer:
        return json.load(answer)


def size(messages: list) -> int:  # about 4 characters a token
    text = json.dumps({"messages": messages, "tools": TOOLS}, separators=(",", ":"),
                      ensure_ascii=False)
    return (len(text) + 3) // 4


messages = [{"role": "user", "content": "Find the bug."}]
smaller = 0
while True:
    answer = chat(messages)
    received = answer["usage"]["prompt_tokens"]
    print(f"history ~{size(messages):,} tokens; the provider received {received:,}")
    smaller += received < size(messages)
    message = answer["choices"][0]["message"]
    messages.append(message)
    if not message.get("tool_calls"):
        break
    for call in message["tool_calls"]:
        path = json.loads(call["function"]["arguments"]).get("path", "?")
        messages.append({"role": "tool", "tool_call_id": call["id"],
                         "content": f"# {path}\n" + "def f(x):\n    return x * 2\n" * 60})

assert smaller, "nothing was compacted: run this behind agentcompact run or proxy"
