"""A live run → export → training: the official OpenAI client wrapped by ``compact`` against
the upstream simulator (asked for ``logprobs``) over a real loopback socket, the Recorder,
``agentcompact export --recompute-logprobs`` with a tiny random Qwen2, then four steps of
our loss on the rows as exported."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("pyarrow")
openai = pytest.importorskip("openai")
transformers = pytest.importorskip("transformers")

from agentcompact import EpisodeEnd, new_plugin_manager  # noqa: E402
from agentcompact.integrations.sdk import compact  # noqa: E402
from agentcompact.plugins.recorder import Recorder  # noqa: E402
from agentcompact.rl.torch_data import collate  # noqa: E402
from agentcompact.testing import Reply, Script, UpstreamSim, serve  # noqa: E402
from agentcompact.trajectory import read_events  # noqa: E402
from agentcompact.trajectory._export_cli import main as export_main  # noqa: E402
from agentcompact.trajectory.export import read_export  # noqa: E402

from .rowkit import QWEN_TOKENIZER  # noqa: E402
from .test_end_to_end import train_steps  # noqa: E402

pytestmark = [pytest.mark.network,
              pytest.mark.skipif(not QWEN_TOKENIZER.exists(), reason="tokenizer absent")]

TOOLS = [{"type": "function", "function": {
    "name": "read_file", "description": "Read a file.",
    "parameters": {"type": "object", "properties": {"path": {"type": "string"}},
                   "required": ["path"]}}}]


def _agent() -> Script:
    counter = itertools.count()

    def answer(body: dict[str, Any]) -> Reply:
        k = next(counter)
        if body.get("tools") and k % 5 != 4:
            return Reply.tool("read_file", {"path": f"src/module_{k}.py"})
        return Reply(f"done ({k})")

    return Script(then=answer)


def _episode(client: Any, pm: Any, episode: str, reward: float, index: int) -> int:
    client.episode_id, client.group_id = episode, "fix-the-bug"
    messages: list[Any] = [{"role": "system", "content": "You are a careful coder."},
                           {"role": "user", "content": "Find and fix the bug."}]
    logprobs = 0
    for _ in range(6):
        completion = client.chat.completions.create(
            model="sim", messages=messages, tools=TOOLS, logprobs=True, top_logprobs=1)
        choice = completion.choices[0]
        logprobs += len(choice.logprobs.content or []) if choice.logprobs else 0
        message = choice.message
        messages.append(message)
        if not message.tool_calls:
            break
        for call in message.tool_calls:
            path = json.loads(call.function.arguments or "{}").get("path", "?")
            messages.append({"role": "tool", "tool_call_id": call.id,
                             "content": f"# {path}\n" + "def f(x):\n    return x * 2\n" * 40})
    pm.hook.agentcompact_log_episode_end(episode=EpisodeEnd(
        episode_id=episode, reward=reward, group_id="fix-the-bug", sample_index=index))
    return logprobs


def test_live_run_exports_rows_that_train(tmp_path: Path) -> None:
    run = tmp_path / "run"
    pm = new_plugin_manager()
    recorder = Recorder(run)
    pm.register(recorder)
    with serve(UpstreamSim(_agent())) as server, openai.OpenAI(
            base_url=server.base_url + "/v1", api_key="sk-test-secret") as raw:
        client = compact(raw, trigger_tokens=1500, plugins=pm)
        served = [_episode(client, pm, f"ep{i}", float(i % 2), i) for i in range(2)]
    recorder.close()
    assert all(n > 0 for n in served)  # the simulator served logprobs as asked
    raw_log = (run / "events.jsonl").read_bytes()
    assert b"sk-test-secret" not in raw_log
    calls = read_events(run).of_kind("model_call")
    assert any(c.data["compacted"] for c in calls)

    tok = transformers.AutoTokenizer.from_pretrained(str(QWEN_TOKENIZER))
    torch.manual_seed(0)
    model = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(
        vocab_size=len(tok), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=4096,
        tie_word_embeddings=True, attn_implementation="eager"))
    model.save_pretrained(str(tmp_path / "model"))
    out = tmp_path / "out"
    assert export_main([str(run), "--out", str(out), "--tokenizer", str(QWEN_TOKENIZER),
                        "--no-progress", "--workers", "1", "--recompute-logprobs",
                        str(tmp_path / "model"), "--recompute-batch-tokens", "4096"]) == 0
    rows = read_export(out)
    assert len({r["episode_id"] for r in rows}) == 2 and len(rows) > 2  # compacted: split
    assert {r["stop_reason"] for r in rows[:-1]} & {"compacted"}
    assert all(r["sampling"]["logprobs_mode"] == "recomputed" for r in rows)

    losses = train_steps(model, collate(rows, pad_token_id=0), 4)
    assert all(math.isfinite(x) for x in losses) and losses[-1] < losses[0], losses
