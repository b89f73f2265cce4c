"""verl runs ``CompactingAgentLoop`` and trains one step on its per-segment outputs.

Real: verl's agent-loop registry and ``hydra.utils.instantiate`` (as ``AgentLoopWorker``
builds a loop), ``ToolAgentLoop``'s tool parser and ``_call_tool`` on a verl
``FunctionTool``, the v1 trainer's ``AgentLoopWorkerTQ._agent_loop_postprocess`` (reward of
the last output copied to the others, one stored row per output under
``{uid}_{session}_{index}``), its ``compute_advantage_for_multi_trajectories`` (GRPO over
each session's last output, broadcast to the session) and verl's PPO policy loss. Stubbed:
the server manager (it samples the tiny model, with tool-call syntax forced the way a
server's structured output would), TransferQueue's storage (a dict) and the reward worker
(a Ray actor in verl: here a function of the last response)."""

from __future__ import annotations

import asyncio
import math
import sys
import types
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("verl")
pytest.importorskip("hydra")  # verl's agent loop instantiates loops with it

from .tinylm import byte_tokenizer, eos_ids, tiny_lm  # noqa: E402

PROMPT = [{"role": "system", "content": "use the echo tool"},
          {"role": "user", "content": "task: " + "q" * 40}]
ECHO = {"type": "function", "function": {
    "name": "echo", "description": "echo a text",
    "parameters": {"type": "object", "properties": {"text": {"type": "string"}},
                   "required": ["text"]}}}


class _Store:
    """TransferQueue's key-value storage as a dict (its service is Ray actors)."""

    def __init__(self) -> None:
        self.rows: dict[str, dict[str, Any]] = {}

    def module(self) -> types.ModuleType:
        tq = types.ModuleType("transfer_queue")

        class KVBatchMeta:  # a type the v1 modules import for annotations
            pass

        async def async_kv_batch_put(keys: list[str], fields: Any = None, tags: Any = None,
                                     partition_id: str | None = None) -> None:
            for i, key in enumerate(keys):
                self.rows[key] = {k: fields[k][i] for k in fields.keys()}

        tq.KVBatchMeta = KVBatchMeta  # type: ignore[attr-defined]
        tq.async_kv_batch_put = async_kv_batch_put  # type: ignore[attr-defined]
        tq.init = lambda *a, **k: None  # type: ignore[attr-defined]
        return tq


@pytest.fixture
def store(monkeypatch: pytest.MonkeyPatch) -> _Store:
    store = _Store()
    monkeypatch.setitem(sys.modules, "transfer_queue", store.module())
    return store


class ToolCallServer:
    """The stub server manager: samples the tiny model token by token. For the first
    ``tool_turns`` responses of a request it forces the Hermes tool-call syntax around a few
    sampled letters (as a server's structured output does); then it samples freely. Each
    token's logprob is the model's (raw) logprob of it."""

    def __init__(self, model: Any, tok: Any, tool_turns: int) -> None:
        self.model, self.tok, self.tool_turns = model, tok, tool_turns
        self.turns: dict[str, int] = {}
        self.eos = eos_ids(tok)[0]
        self.letters = [int(tok.convert_tokens_to_ids(c)) for c in "abc"]

    def _ids(self, text: str) -> list[int]:
        return list(self.tok.encode(text, add_special_tokens=False))

    async def generate(self, request_id: str, *, prompt_ids: list[int],
                       sampling_params: dict[str, Any], **kwargs: Any) -> Any:
        from verl.workers.rollout.replica import TokenOutput

        turn = self.turns[request_id] = self.turns.get(request_id, 0) + 1
        if turn <= self.tool_turns:
            plan: list[Any] = [*self._ids('<tool_call>\n{"name": "echo", "arguments": '
                                          '{"text": "'), *([self.letters] * 4),
                               *self._ids('"}}\n</tool_call>'), self.eos]
        else:
            plan = [None] * min(int(sampling_params["max_tokens"]), 12)
        ids = self._sample(prompt_ids, plan)
        return TokenOutput(token_ids=ids, log_probs=self._logprobs(prompt_ids, ids),
                           stop_reason="completed", extra_fields={"global_steps": 1})

    def _sample(self, prompt: list[int], plan: list[Any]) -> list[int]:
        out: list[int] = []
        with torch.no_grad():
            step_out = self.model(torch.tensor([prompt]), use_cache=True)
            for step in plan:
                if isinstance(step, int):
                    token = step
                else:
                    logits = step_out.logits[0, -1]
                    if step is not None:  # allowed ids only
                        keep = torch.full_like(logits, float("-inf"))
                        keep[step] = 0.0
                        logits = logits + keep
                    token = int(torch.multinomial(torch.softmax(logits, -1), 1))
                out.append(token)
                if step is None and token == self.eos:
                    break
                step_out = self.model(torch.tensor([[token]]),
                                      cache=step_out.cache, use_cache=True)
        return out

    def _logprobs(self, prompt: list[int], ids: list[int]) -> list[float]:
        with torch.no_grad():
            logits = self.model(torch.tensor([prompt + ids])).logits[0]
        logp = torch.log_softmax(logits[len(prompt) - 1:-1].float(), -1)
        return logp.gather(-1, torch.tensor(ids)[:, None]).squeeze(-1).tolist()


class RewardWorker:
    """verl's reward-loop worker (a Ray actor) as a local object: the reward is the share
    of ``a`` bytes in the last response."""

    def __init__(self, tok: Any) -> None:
        self.tok = tok
        self.compute_score = types.SimpleNamespace(remote=self._score)

    async def _score(self, data: Any) -> dict[str, Any]:
        text = self.tok.decode(data.batch["responses"][-1].tolist())
        return {"reward_score": text.count("a") / max(len(text), 1),
                "reward_extra_info": {}}


def _config(loss_agg_mode: str = "token-mean") -> Any:
    from omegaconf import OmegaConf

    return OmegaConf.create({
        "trainer": {"use_v1": True},
        "data": {"apply_chat_template_kwargs": {}, "mm_processor_kwargs": {}},
        "actor_rollout_ref": {
            "actor": {"loss_agg_mode": loss_agg_mode},
            "rollout": {
                "prompt_length": 2048, "response_length": 48, "full_determinism": False,
                "multi_turn": {"max_user_turns": 8, "max_assistant_turns": 6,
                               "max_parallel_calls": 1, "max_tool_response_length": 256,
                               "tool_response_truncate_side": "middle", "format": "hermes"}}},
    })


def _loop(config: Any, server: Any, tok: Any, options: dict[str, Any]) -> Any:
    import hydra
    from verl.experimental.agent_loop.agent_loop import (
        DictConfigWrap,
        ToolListWrap,
        _agent_loop_registry,
    )
    from verl.tools.function_tool import FunctionTool
    from verl.tools.schemas import OpenAIFunctionToolSchema
    from verl.utils.dataset.rl_dataset import RLHFDataset

    import agentcompact.rl.verl  # noqa: F401  # registers "agentcompact"

    echo = FunctionTool(name="echo", fn=lambda text: "echo " + text + " " + "e" * 60,
                        tool_schema=OpenAIFunctionToolSchema.model_validate(ECHO))
    entry = {**_agent_loop_registry["agentcompact"], **options}
    return hydra.utils.instantiate(
        config=entry, trainer_config=DictConfigWrap(config=config), server_manager=server,
        tokenizer=tok, processor=None, hf_model_type="qwen2", dataset_cls=RLHFDataset,
        data_config=DictConfigWrap(config.data), tools=ToolListWrap([echo]))


def _worker(config: Any, tok: Any) -> Any:
    """verl's v1 AgentLoopWorkerTQ, without the Ray actor and its __init__ (config loading,
    tools, trace): the attributes its postprocess reads."""
    from verl.trainer.ppo.v1.agent_loop_tq import AgentLoopWorkerTQ

    worker = object.__new__(AgentLoopWorkerTQ.__ray_metadata__.modified_class)
    worker.config, worker.tokenizer, worker.processor = config, tok, None
    worker.reward_loop_worker_handles = [RewardWorker(tok)]
    worker.distillation_enabled = False
    worker.mm_processor_kwargs = {}
    return worker


def _batch(store: _Store, pad: int) -> tuple[Any, list[str]]:
    """The stored rows as the v1 trainer reads them for its advantage (response fields
    right-padded) and for the actor (prompts left-padded)."""
    from verl.protocol import DataProto

    keys = sorted(store.rows, key=lambda k: (k.rsplit("_", 2)[0], int(k.rsplit("_", 2)[1]),
                                             int(k.rsplit("_", 2)[2])))
    rows = [store.rows[k] for k in keys]
    p = max(len(r["prompts"]) for r in rows)
    n = max(len(r["responses"]) for r in rows)

    def right(key: str, dtype: Any) -> Any:
        return torch.stack([torch.nn.functional.pad(r[key].to(dtype), (0, n - len(r[key])))
                            for r in rows])

    prompts = torch.stack([torch.nn.functional.pad(r["prompts"], (p - len(r["prompts"]), 0),
                                                   value=pad) for r in rows])
    responses = right("responses", torch.long).masked_fill(right("response_mask", torch.long)
                                                           .eq(0) & right("responses",
                                                                          torch.long).eq(0), pad)
    attention = torch.cat([
        torch.stack([torch.nn.functional.pad(torch.ones(len(r["prompts"]), dtype=torch.long),
                                             (p - len(r["prompts"]), 0)) for r in rows]),
        torch.stack([torch.nn.functional.pad(torch.ones(len(r["responses"]), dtype=torch.long),
                                             (0, n - len(r["responses"]))) for r in rows])], 1)
    data = DataProto.from_single_dict({
        "prompts": prompts, "responses": responses, "attention_mask": attention,
        "input_ids": torch.cat([prompts, responses], 1),
        "position_ids": (attention.cumsum(-1) - 1).clamp(min=0),
        "response_mask": right("response_mask", torch.long),
        "rm_scores": right("rm_scores", torch.float32),
        "token_level_rewards": right("rm_scores", torch.float32),
        "old_log_probs": right("rollout_log_probs", torch.float32),
        "uid": np.array([str(r["uid"]) for r in rows], dtype=object)})
    return data, keys


def _log_prob(model: Any, b: Any) -> Any:
    logits = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"],
                   position_ids=b["position_ids"]).logits
    r = b["responses"].shape[1]
    return torch.log_softmax(logits[:, -r - 1:-1].float(), -1).gather(
        -1, b["responses"][..., None]).squeeze(-1)


def _rollouts(loop_options: dict[str, Any], tok: Any, model: Any, store: _Store,
              config: Any, sessions: int = 2) -> list[list[Any]]:
    server = ToolCallServer(model, tok, tool_turns=4)

    async def go() -> list[list[Any]]:
        worker = _worker(config, tok)
        episodes = []
        for session in range(sessions):
            loop = _loop(config, server, tok, loop_options)
            kwargs = {"raw_prompt": PROMPT, "uid": "task0", "session_id": session,
                      "global_steps": 1, "index": 0}
            outputs = await loop.run({"temperature": 1.0, "top_p": 1.0, "top_k": -1,
                                      "logprobs": True}, **kwargs)
            episodes.append(outputs)
            await worker._agent_loop_postprocess(outputs, False, **kwargs)
        return episodes

    return asyncio.run(go())


def test_verl_v1_trains_one_step_on_per_segment_outputs(tmp_path: Path, store: _Store) -> None:
    from verl.trainer.ppo import core_algos
    from verl.trainer.ppo.v1.utils import compute_advantage_for_multi_trajectories
    from verl.workers.config import ActorConfig

    tok = transformers.AutoTokenizer.from_pretrained(str(byte_tokenizer(tmp_path / "tok")))
    model = tiny_lm(seed=5)
    torch.manual_seed(0)
    config = _config()
    episodes = _rollouts({"trigger": 500, "trigger_low": 0.9, "trigger_high": 1.1,
                          "seed": 3, "max_tokens": 24}, tok, model, store, config)

    # several outputs per rollout (compacted), all stored under {uid}_{session}_{index}
    assert all(len(e) >= 2 for e in episodes), [len(e) for e in episodes]
    assert sorted(store.rows) == sorted(f"task0_{s}_{i}" for s, e in enumerate(episodes)
                                        for i in range(len(e)))
    for e in episodes:  # verl's reward of the last output, copied to the session's others
        assert len({float(o.reward_score) for o in e}) == 1
        assert [o.extra_fields["loss_weight"] for o in e] == [1.0] * len(e)  # token-mean
        assert [o.extra_fields["segment_index"] for o in e] == list(range(len(e)))

    data, keys = _batch(store, tok.pad_token_id)
    data = compute_advantage_for_multi_trajectories(
        data, batch_keys=keys, adv_estimator=core_algos.AdvantageEstimator.GRPO,
        norm_adv_by_std_in_grpo=True)
    b = data.batch
    mask = b["response_mask"].bool()
    # one advantage per rollout, on every loss token of each of its segments
    sessions = [k.rsplit("_", 1)[0] for k in keys]
    for s in set(sessions):
        values = b["advantages"][[i for i, x in enumerate(sessions) if x == s]][
            mask[[i for i, x in enumerate(sessions) if x == s]]]
        assert values.numel() and torch.allclose(values, values[0].expand_as(values))

    with torch.no_grad():  # the outputs' logprobs are the policy's own, in verl's layout
        fresh = _log_prob(model, b)
    assert torch.allclose(fresh[mask], b["old_log_probs"][mask], atol=1e-4)

    actor = ActorConfig(strategy="fsdp", rollout_n=2, ppo_micro_batch_size_per_gpu=1,
                        ppo_mini_batch_size=1)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    loss, _ = core_algos.compute_policy_loss_vanilla(
        old_log_prob=b["old_log_probs"], log_prob=_log_prob(model, b),
        advantages=b["advantages"], response_mask=b["response_mask"],
        loss_agg_mode="token-mean", config=actor)
    loss.backward()
    optimizer.step()
    assert math.isfinite(loss.item())
    with torch.no_grad():
        assert not torch.allclose(_log_prob(model, b)[mask], fresh[mask])


def test_session_weights_when_verl_averages_sequences(tmp_path: Path, store: _Store) -> None:
    tok = transformers.AutoTokenizer.from_pretrained(str(byte_tokenizer(tmp_path / "tok")))
    episodes = _rollouts({"trigger": 500, "seed": 3, "max_tokens": 24}, tok, tiny_lm(seed=5),
                         store, _config("seq-mean-token-mean"), sessions=1)
    outputs = episodes[0]
    assert len(outputs) >= 2
    assert [o.extra_fields["loss_weight"] for o in outputs] == [1 / len(outputs)] * len(outputs)


def test_refused_outside_verls_v1_trainer(tmp_path: Path) -> None:
    from hydra.errors import InstantiationException  # hydra wraps the loop's ConfigError

    tok = transformers.AutoTokenizer.from_pretrained(str(byte_tokenizer(tmp_path / "tok")))
    config = _config()
    config.trainer.use_v1 = False

    async def build() -> Any:
        return _loop(config, None, tok, {})

    with pytest.raises(InstantiationException, match=r"ConfigError.*trainer\.use_v1=true"):
        asyncio.run(build())
