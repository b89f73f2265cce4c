"""Gemini through the compaction proxy, offline: the upstream simulator plays the Gemini
API, the official Google Gen AI SDK is the client (pip install 'agentcompact[proxy]'
google-genai)."""

import base64

from google import genai
from google.genai import types

from agentcompact import Budget
from agentcompact.integrations.proxy import ProxyConfig, ThreadedServer, create_app
from agentcompact.testing import Reply, Script, UpstreamSim, filler_text, serve


def history(steps: int) -> list[dict]:
    """What Gemini CLI sends: the prompt, then per step a signed call and its result."""
    contents = [{"role": "user", "parts": [{"text": "Read the step files one by one."}]}]
    for k in range(steps):
        signature = base64.b64encode(f"reasoning state {k}".encode()).decode()
        contents.append({"role": "model", "parts": [
            {"functionCall": {"id": f"read_{k}", "name": "read_file",
                              "args": {"file_path": f"step{k:03d}.txt"}},
             "thoughtSignature": signature}]})
        contents.append({"role": "user", "parts": [
            {"functionResponse": {"id": f"read_{k}", "name": "read_file",
                                  "response": {"output": filler_text(400)}}}]})
    return contents


sim = UpstreamSim(Script(then=Reply("All steps done.")))
with serve(sim) as upstream:
    config = ProxyConfig(port=0, budget=Budget(8000), counter="chars", store="memory:",
                         gemini_upstream=upstream.base_url, log_requests=False)
    with ThreadedServer(create_app(config)) as proxy:
        client = genai.Client(api_key="dummy-key",
                              http_options=types.HttpOptions(base_url=proxy.base_url))
        sent_by_client = history(30)
        answer = client.models.generate_content(model="gemini-3-pro-preview",
                                                contents=sent_by_client)
    upstream_contents = upstream.requests[-1].body["contents"]

print(answer.text)
print(f"{len(sent_by_client)} contents from the client, {len(upstream_contents)} upstream")
print(upstream_contents[1]["parts"][0]["text"].splitlines()[0])
