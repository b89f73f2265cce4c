"""What a LlamaIndex FunctionAgent sends in one long run, with CompactingMemory alone and
with the memory's compacting LLM (``memory.wrap(llm)``), side by side in one run.

One ``agent.run`` of ``--steps`` tool calls (~430 tokens each) against the upstream
simulator, a system prompt of ``--system`` tokens, trigger ``--trigger``; the largest
request the model received (messages, system prompt and tool schemas, in tiktoken
o200k tokens), and its ratio to the trigger, for each set-up.

    TIKTOKEN_CACHE_DIR=../shared/data/tiktoken python benchmarks/integration_llamaindex_scope.py
"""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

import httpx
from llama_index.core.agent.workflow import FunctionAgent
from llama_index.llms.openai_like import OpenAILike

from agentcompact import Budget, Engine
from agentcompact.integrations.llamaindex import CompactingMemory
from agentcompact.testing import Reply, Script, UpstreamSim, filler_text, serve


def read_file(path: str) -> str:
    """Read a file of the repository."""
    return f"contents of {path}\n" + filler_text(400)


def sent_tokens(body: dict[str, Any], meter: Engine) -> int:
    return meter.count(body["messages"]) + meter.fixed_tokens(body)


async def peak(wrapped: bool, args: argparse.Namespace, meter: Engine) -> tuple[int, int]:
    reads = [Reply.tool("read_file", {"path": f"src/m{i}.py"}) for i in range(args.steps)]
    memory = CompactingMemory(budget=Budget(trigger_tokens=args.trigger))
    async with serve(UpstreamSim(Script(*reads, then=lambda body: "done"))) as server, \
            httpx.AsyncClient() as http:
        llm: Any = OpenAILike(model="m", api_base=server.base_url + "/v1", api_key="x",
                              is_chat_model=True, is_function_calling_model=True,
                              max_retries=0, context_window=10**6, async_http_client=http)
        agent = FunctionAgent(tools=[read_file], llm=memory.wrap(llm) if wrapped else llm,
                              system_prompt="Rules.\n" + filler_text(args.system))
        await agent.run("Read every module.", memory=memory, max_iterations=args.steps + 5)
        sizes = [sent_tokens(r.body, meter) for r in server.requests
                 if r.path == "/v1/chat/completions"]
    return max(sizes), len(sizes)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--system", type=int, default=15_000, help="system prompt tokens")
    parser.add_argument("--trigger", type=int, default=20_000)
    args = parser.parse_args()
    meter = Engine(dialect="openai_chat", budget=Budget(trigger_tokens=10**9))
    print(f"one run of {args.steps} tool calls, system prompt ~{args.system:,} tokens, "
          f"trigger {args.trigger:,}")
    for wrapped in (False, True):
        largest, calls = await peak(wrapped, args, meter)
        name = "memory.wrap(llm)" if wrapped else "CompactingMemory alone"
        print(f"{name:>24}: largest request {largest:,} tokens "
              f"({largest / args.trigger:.2f}x the trigger) over {calls} calls")


if __name__ == "__main__":
    asyncio.run(main())
