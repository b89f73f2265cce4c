"""A live run → export → each trainer: the official OpenAI client wrapped by ``compact``
with the summary strategy and a trained summarizer (the policy writes its own summaries),
the Recorder, and the upstream simulator serving logprobs and token ids as vLLM does
(``return_token_ids``, the shared Qwen tokenizer's chat template), over a real loopback
socket. ``agentcompact export`` (no recompute) writes rows whose logprobs are the
simulator's; they then run in verl's ``core_algos`` on the ``DataProto``, TRL's
``GRPOTrainer`` with ``rollout_func`` and SkyRL's validator, and train a tiny random Qwen2
with our loss."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path
from typing import Any

import pytest

from agentcompact import Budget

torch = pytest.importorskip("torch")
pytest.importorskip("pyarrow")
openai = pytest.importorskip("openai")
transformers = pytest.importorskip("transformers")

from agentcompact import EpisodeEnd, new_plugin_manager  # noqa: E402
from agentcompact.integrations.sdk import compact  # noqa: E402
from agentcompact.plugins.recorder import Recorder  # noqa: E402
from agentcompact.rl.ppo import policy_loss_from_hidden  # noqa: E402
from agentcompact.rl.torch_data import collate  # noqa: E402
from agentcompact.strategies import SummaryStrategy  # noqa: E402
from agentcompact.testing import (  # noqa: E402
    Reply,
    Script,
    UpstreamSim,
    logprob_of,
    serve,
)
from agentcompact.trajectory import read_events  # noqa: E402
from agentcompact.trajectory._export_cli import main as export_main  # noqa: E402
from agentcompact.trajectory.export import read_export  # noqa: E402

from .rowkit import QWEN_TOKENIZER  # noqa: E402
from .test_end_to_end import train_steps  # noqa: E402
from .test_trainers import skyrl_validates, trl_two_steps, verl_two_steps  # noqa: E402

pytestmark = [pytest.mark.network,
              pytest.mark.skipif(not QWEN_TOKENIZER.exists(), reason="tokenizer absent")]

TOOLS = [{"type": "function", "function": {
    "name": "read_file", "description": "Read a file.",
    "parameters": {"type": "object", "properties": {"path": {"type": "string"}},
                   "required": ["path"]}}}]
SUMMARY = ("Summary: the agent read src/module_0.py and the next modules; each defines "
           "f(x) returning x * 2. The bug is not found yet; read the remaining modules.")
ASK = {"return_token_ids": True}  # vLLM's request flag


def _agent() -> Script:
    counter = itertools.count()

    def answer(body: dict[str, Any]) -> Reply:
        if not body.get("tools"):  # the summarizer's request (its own prompt, no tools)
            return Reply(SUMMARY)
        k = next(counter)
        if k % 5 != 4:
            return Reply.tool("read_file", {"path": f"src/module_{k}.py"})
        return Reply(f"done ({k})")

    return Script(then=answer)


def _turn(client: Any, messages: list[Any], stream: bool) -> Any:
    """One model call, plain or streamed (the SDK's stream helper), asking for logprobs
    and vLLM's token ids; the assistant message."""
    kwargs = {"model": "sim", "messages": messages, "tools": TOOLS, "logprobs": True,
              "top_logprobs": 1, "extra_body": ASK}
    if not stream:
        return client.chat.completions.create(**kwargs).choices[0].message
    with client.chat.completions.stream(**kwargs) as events:
        for _ in events:
            pass
        return events.get_final_completion().choices[0].message


def _episode(client: Any, pm: Any, episode: str, reward: float, index: int) -> None:
    client.episode_id, client.group_id = episode, "fix-the-bug"
    messages: list[Any] = [{"role": "system", "content": "You are a careful coder."},
                           {"role": "user", "content": "Find and fix the bug."}]
    for _ in range(6):
        message = _turn(client, messages, stream=index == 1)
        messages.append(message)
        if not message.tool_calls:
            break
        for call in message.tool_calls:
            path = json.loads(call.function.arguments or "{}").get("path", "?")
            messages.append({"role": "tool", "tool_call_id": call.id,
                             "content": f"# {path}\n" + "def f(x):\n    return x * 2\n" * 8})
    pm.hook.agentcompact_log_episode_end(episode=EpisodeEnd(
        episode_id=episode, reward=reward, group_id="fix-the-bug", sample_index=index))


def _tiny_qwen(vocab: int, seed: int) -> Any:
    torch.manual_seed(seed)
    return transformers.Qwen2ForCausalLM(transformers.Qwen2Config(
        vocab_size=vocab, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=4096,
        tie_word_embeddings=True, attn_implementation="eager"))


def _relabelled(rows: list[dict[str, Any]], pad: int) -> tuple[list[dict[str, Any]], int]:
    """The rows with their token ids relabelled ``0..K-1`` (``pad`` → 0), and ``K``."""
    used = sorted({t for r in rows for key in ("prompt_ids", "response_ids") for t in r[key]}
                  - {pad})
    index = {pad: 0, **{t: i + 1 for i, t in enumerate(used)}}
    return [dict(r, prompt_ids=[index[t] for t in r["prompt_ids"]],
                 response_ids=[index[t] for t in r["response_ids"]]) for r in rows], len(index)


def _sampled_runs(row: dict[str, Any]) -> list[list[float]]:
    """The logprobs of each run of consecutive mask-1 tokens (one model call's sample)."""
    runs: list[list[float]] = []
    previous = 0
    for m, lp in zip(row["response_mask"], row["rollout_logprobs"], strict=True):
        if m and not previous:
            runs.append([])
        if m:
            runs[-1].append(lp)
        previous = m
    return runs


# the trainers' own deprecation noise (TRL 1.16's GRPOConfig under transformers 5)
@pytest.mark.filterwarnings("ignore::FutureWarning")
def test_live_run_exports_the_servers_logprobs_and_every_trainer_runs_them(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run = tmp_path / "run"
    pm = new_plugin_manager()
    recorder = Recorder(run)
    pm.register(recorder)
    tok = transformers.AutoTokenizer.from_pretrained(str(QWEN_TOKENIZER))
    with serve(UpstreamSim(_agent(), tokenizer=tok)) as server, openai.OpenAI(
            base_url=server.base_url + "/v1", api_key="sk-test-secret", max_retries=0) as raw:
        summarizer = SummaryStrategy(base_url=server.base_url + "/v1", model="sim-policy",
                                     api_key="sk-summarizer-secret", trained=True,
                                     return_token_ids=True, min_output_tokens=16)
        client = compact(raw, budget=Budget(trigger_tokens=450, target_tokens=300),
                         strategy=summarizer,
                         plugins=pm)
        for i in range(2):
            _episode(client, pm, f"ep{i}", float(i % 2), i)
    recorder.close()
    raw_log = (run / "events.jsonl").read_bytes()
    assert b"sk-test-secret" not in raw_log and b"sk-summarizer-secret" not in raw_log
    events = read_events(run)
    calls = events.of_kind("model_call")
    assert any(c.data["compacted"] for c in calls)
    # the SDK wrapper picked up the simulator's ids, plain and streamed
    assert all(c.data["prompt_token_ids"] and c.data["response_token_ids"]
               and len(c.data["response_logprobs"]) == len(c.data["response_token_ids"])
               for c in calls)
    summaries = events.of_kind("summary_call")
    assert summaries and all(s.data["trained"] and s.data["response_token_ids"]
                             and s.data["response_logprobs"] for s in summaries)

    out = tmp_path / "out"
    assert export_main([str(run), "--out", str(out), "--tokenizer", str(QWEN_TOKENIZER),
                        "--no-progress", "--workers", "1"]) == 0
    rows = read_export(out)
    assert len({r["episode_id"] for r in rows}) == 2 and len(rows) > 2  # compacted: split
    assert "compacted" in {r["stop_reason"] for r in rows}
    trained_summaries = [r for r in rows if r["summary_trained"] and r["summary_span"]]
    assert trained_summaries  # the summarizer's own sample is a trainable segment
    for r in trained_summaries:
        start, end = r["summary_span"]
        assert all(r["response_mask"][start:end])
        assert tok.decode(r["response_ids"][start:end]).startswith(SUMMARY)
    # the logprobs are the simulator's as served (not recomputed, no zeros): each model
    # call's sample scores its k-th token logprob_of(k)
    assert all(r["sampling"]["logprobs_mode"] == "raw" for r in rows)
    for r in rows:
        runs = _sampled_runs(r)
        assert runs
        for got in runs:
            assert got == pytest.approx([logprob_of(k) for k in range(len(got))], abs=1e-6)

    vocab = len(tok)
    # verl: its own compute_policy_loss_vanilla on the DataProto, two optimizer steps
    verl_two_steps(rows, _tiny_qwen(vocab, 1), tok.pad_token_id)
    # TRL: GRPOTrainer (SegmentGRPOTrainer) with rollout_func, two optimizer steps. TRL
    # builds full-vocabulary logits at every completion token (152k floats each: minutes on
    # a CPU), so its tiny model's vocabulary is the rows' own ids, relabelled 0..K-1 (the
    # pad first); masks, logprobs, advantages and grouping are the rows' as exported.
    pad, pad_token = tok.pad_token_id, tok.pad_token
    relabelled, size = _relabelled(rows, pad)
    tok.pad_token = tok.convert_ids_to_tokens(0)
    seen = trl_two_steps(relabelled, _tiny_qwen(size, 2), tok, tmp_path / "trl", monkeypatch)
    tok.pad_token = pad_token
    assert {g for g, _ in seen} == {"fix-the-bug"} and max(n for _, n in seen) > 1
    # SkyRL: its generator-output validator on the step-wise rows
    skyrl_validates(rows)

    # our loss falls over four steps on the rows as exported
    model = _tiny_qwen(vocab, 0)
    batch = collate(rows, pad_token_id=tok.pad_token_id)
    losses = train_steps(model, batch, 4)
    assert all(math.isfinite(x) for x in losses) and losses[-1] < losses[0], losses

    # gradients reach exactly the mask-1 tokens: the hidden state at t - 1 predicts the token
    # at t (ratio clipping off so no mask-1 token's gradient is clipped to zero)
    hidden = model.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                         position_ids=batch["position_ids"]).last_hidden_state
    leaf = hidden.detach().requires_grad_()
    policy_loss_from_hidden(leaf, model.lm_head.weight, batch, clip_eps=1e6,
                            clip_ratio_c=None).backward()
    assert leaf.grad is not None
    reached = leaf.grad.abs().sum(-1)[:, :-1] > 0
    trained = batch["loss_mask"][:, 1:] > 0
    assert trained.any() and torch.equal(reached, trained)
