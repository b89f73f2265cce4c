"""The rows in each trainer's own code: verl's DataProto and policy loss, TRL's GRPOTrainer,
SkyRL's generator-output validator. Each test skips when its trainer is not installed."""

from __future__ import annotations

import math
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("pyarrow")
transformers = pytest.importorskip("transformers")

from agentcompact.rl import assign_advantages  # noqa: E402
from agentcompact.rl._schema import to_float32, validate_rows  # noqa: E402
from agentcompact.rl.adapters import to_skyrl, to_verl  # noqa: E402
from agentcompact.rl.ppo import policy_loss  # noqa: E402
from agentcompact.rl.torch_data import collate  # noqa: E402

from .rowkit import QWEN_TOKENIZER, make_episode  # noqa: E402

V = 64
PAD = 0


def tiny_model(seed: int = 0) -> Any:
    torch.manual_seed(seed)
    config = transformers.Qwen2Config(
        vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=128,
        tie_word_embeddings=True, attn_implementation="eager")
    return transformers.Qwen2ForCausalLM(config)


def group_rows() -> list[dict[str, Any]]:
    """Two groups; episode E1 split in three segments (a compacted episode)."""
    rows = make_episode("E1", [[1, 1, 0, 1], [0, 1, 1], [1, 0, 1]], reward=1.0, seed=1)
    rows += make_episode("E2", [[1, 1, 1, 0, 1]], sample_index=1, reward=0.0, seed=2)
    rows += make_episode("E3", [[1, 0, 1]], group_id="g1", reward=1.0, seed=3)
    rows += make_episode("E4", [[0, 1, 1, 1], [1, 1]], group_id="g1", sample_index=1,
                         reward=0.0, seed=4)
    for r in rows:
        r["prompt_ids"] = [1 + int(t) % (V - 1) for t in r["prompt_ids"]]
        r["response_ids"] = [1 + int(t) % (V - 1) for t in r["response_ids"]]
    rows = assign_advantages(to_float32(rows))
    validate_rows(rows)
    return rows


# --------------------------------------------------------------------------- verl


def test_verl_policy_loss_on_our_rows_agrees_with_ours_dual_clip_included() -> None:
    protocol = pytest.importorskip("verl.protocol")
    core_algos = pytest.importorskip("verl.trainer.ppo.core_algos")
    from verl.workers.config import ActorConfig

    rows = group_rows()
    data = protocol.DataProto.from_single_dict(to_verl(rows, pad_token_id=PAD))
    for key in ("input_ids", "attention_mask", "position_ids", "responses", "response_mask",
                "old_log_probs", "advantages", "returns"):
        assert key in data.batch.keys(), key
    assert list(data.non_tensor_batch["uid"]) == [r["group_id"] for r in rows]
    model = tiny_model()
    config = ActorConfig(strategy="fsdp", rollout_n=2, ppo_micro_batch_size_per_gpu=1,
                         ppo_mini_batch_size=1)
    assert config.get("clip_ratio_c", 3.0) == 3.0  # verl's default dual-clip bound
    b = data.batch
    r_len = b["responses"].shape[1]
    with torch.no_grad():
        logits = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"],
                       position_ids=b["position_ids"]).logits
    log_prob = torch.log_softmax(logits[:, -r_len - 1:-1].float(), -1).gather(
        -1, b["responses"][..., None]).squeeze(-1)
    # make some ratios far from 1 so the clip and the dual clip both act
    old = b["old_log_probs"] - 4.0 * (torch.arange(r_len) % 2)
    theirs, _ = core_algos.compute_policy_loss_vanilla(
        old_log_prob=old, log_prob=log_prob, advantages=b["advantages"],
        response_mask=b["response_mask"], loss_agg_mode="token-mean", config=config)

    ours_rows = [dict(r, rollout_logprobs=[lp - 4.0 * (t % 2) if m else 0.0 for t, (lp, m) in
                                           enumerate(zip(r["rollout_logprobs"],
                                                         r["response_mask"]))])
                 for r in rows]
    batch = collate(ours_rows, PAD, "token-mean")
    with torch.no_grad():
        our_logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                           position_ids=batch["position_ids"]).logits
    ours = policy_loss(our_logits, batch)
    assert ours.item() == pytest.approx(theirs.item(), abs=2e-5)
    undual = policy_loss(our_logits, batch, clip_ratio_c=None)
    assert abs(undual.item() - theirs.item()) > 1e-3  # the dual clip matters on these rows


def test_verl_refuses_rows_without_logprobs_unless_asked_to_recompute() -> None:
    from agentcompact.errors import ExportError

    rows = group_rows()
    rows[2] = dict(rows[2], sampling=dict(rows[2]["sampling"], logprobs_mode="none"))
    with pytest.raises(ExportError, match="episode 'E1' segment 2"):
        to_verl(rows, pad_token_id=PAD)
    assert "old_log_probs" not in to_verl(rows, pad_token_id=PAD, old_log_probs=False)


# --------------------------------------------------------------------------- TRL


def trl_two_steps(rows: list[dict[str, Any]], model: Any, tok: Any, tmp_path: Any,
                  monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int]]:
    """Two optimizer steps of ``SegmentGRPOTrainer`` (TRL's GRPOTrainer, ``rollout_func``)
    on ``rows``, each group's episodes handed out as its members; the (group, segments) of
    every member handed out."""
    pytest.importorskip("trl")
    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func is "experimental"
    pytest.importorskip("datasets")
    from trl import GRPOConfig

    from agentcompact.rl.trl import SegmentGRPOTrainer, to_trl_episodes

    by_group: dict[str, list[list[dict[str, Any]]]] = {}
    for r in rows:
        eps = by_group.setdefault(r["group_id"], [])
        if r["segment_index"] == 0:
            eps.append([])
        eps[-1].append(r)
    members = {len(eps) for eps in by_group.values()}
    assert len(members) == 1, "every group needs as many episodes (num_generations)"
    seen: list[tuple[str, int]] = []

    def rollout_func(prompts: list[Any], trainer: Any) -> dict[str, list[Any]]:
        out_rows, index, used = [], [], {}
        for i, prompt in enumerate(prompts):
            k = used[prompt] = used.get(prompt, -1) + 1  # the k-th member of this group
            episode = by_group[prompt][k]
            seen.append((prompt, len(episode)))
            out_rows += episode
            index += [i] * len(episode)
        return to_trl_episodes(out_rows, index)

    n = members.pop()
    longest = max(len(r["response_ids"]) for r in rows)
    args = GRPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=n,
                      num_generations=n, steps_per_generation=1, max_steps=2,
                      learning_rate=1e-3, loss_type="dapo", beta=0.0, logging_steps=1,
                      report_to=[], use_cpu=True, bf16=False, save_strategy="no",
                      max_completion_length=longest, seed=0, dataloader_num_workers=0)
    from .tinylm import prompts_dataset

    train = prompts_dataset(sorted(by_group) * 4)
    trainer = SegmentGRPOTrainer(model=model, reward_funcs=lambda **kw: [0.0] * n, args=args,
                                 train_dataset=train, processing_class=tok,
                                 rollout_func=rollout_func)
    trainer.train()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert len(losses) == 2 and all(math.isfinite(x) for x in losses), losses
    assert trainer.state.global_step == 2
    return seen


@pytest.mark.skipif(not QWEN_TOKENIZER.exists(), reason=f"tokenizer absent: {QWEN_TOKENIZER}")
# TRL 1.16's own GRPOConfig defaults trip transformers 5's deprecation of gradient_checkpointing
@pytest.mark.filterwarnings("ignore::FutureWarning")
def test_trl_grpo_trainer_trains_compacted_episodes_as_group_members(
        tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    tok = transformers.AutoTokenizer.from_pretrained(str(QWEN_TOKENIZER))
    tok.pad_token = tok.convert_ids_to_tokens(PAD)  # inside the tiny model's 64-token vocabulary
    seen = trl_two_steps(group_rows(), tiny_model(1), tok, tmp_path, monkeypatch)
    # each group member was one whole episode: E1's three segments came together
    assert ("g0", 3) in seen and all(g in ("g0", "g1") for g, _ in seen)


# --------------------------------------------------------------------------- SkyRL


def _skyrl() -> Any:
    pytest.importorskip("skyrl")
    import typing

    typing_extensions = pytest.importorskip("typing_extensions")
    # skyrl 0.3.0 says Python >= 3.11, but skyrl/tinker/types.py hands typing.TypedDict to
    # pydantic, which refuses it before 3.12: alias it for the import (3.12+ needs nothing)
    saved = typing.TypedDict
    try:
        typing.TypedDict = typing_extensions.TypedDict  # type: ignore[misc]
        from skyrl.train.generators.base import TrajectoryID
        from skyrl.train.utils.trainer_utils import validate_generator_output
    except ImportError as exc:
        pytest.skip(f"skyrl does not import here: {exc}")
    finally:
        typing.TypedDict = saved  # type: ignore[misc]
    return TrajectoryID, validate_generator_output


def skyrl_validates(rows: list[dict[str, Any]]) -> None:
    """SkyRL's own ``validate_generator_output`` (step-wise) passes on ``to_skyrl(rows)``."""
    trajectory_id, validate = _skyrl()
    out = to_skyrl(rows)
    out["trajectory_ids"] = [trajectory_id(**t) for t in out["trajectory_ids"]]
    episodes = len({r["episode_id"] for r in rows})
    validate(episodes, out, step_wise=True)
    assert sum(out["is_last_step"]) == episodes


def test_skyrl_validator_passes_on_our_step_wise_rows() -> None:
    skyrl_validates(group_rows())


def verl_log_prob(model: Any, b: Any) -> Any:
    """``log π(responses)`` ``[B, R]`` on a verl batch (prompts left-padded, responses
    right-padded) where ``response_mask`` is 1 (0 elsewhere: verl's loss masks those),
    gathered in chunks over the vocabulary (a 152k vocabulary never builds ``B × R × V``
    logits)."""
    from agentcompact.rl.logprobs import chosen_logprobs

    hidden = model.model(input_ids=b["input_ids"], attention_mask=b["attention_mask"],
                         position_ids=b["position_ids"]).last_hidden_state
    r_len, width = b["responses"].shape[1], b["input_ids"].shape[1]
    where = torch.zeros_like(b["input_ids"])
    where[:, width - r_len:] = b["response_mask"]
    logp, rows, positions = chosen_logprobs(hidden, model.lm_head.weight,
                                            {"input_ids": b["input_ids"], "loss_mask": where})
    out = torch.zeros(b["responses"].shape, dtype=logp.dtype)
    return out.index_put((rows, positions - (width - r_len)), logp)


def verl_two_steps(rows: list[dict[str, Any]], model: Any, pad_token_id: int) -> list[float]:
    """Two Adam steps with verl's own ``compute_policy_loss_vanilla`` on the ``DataProto``
    of ``rows`` (its ``old_log_probs``, ``advantages`` and ``response_mask``)."""
    protocol = pytest.importorskip("verl.protocol")
    core_algos = pytest.importorskip("verl.trainer.ppo.core_algos")
    from verl.workers.config import ActorConfig

    data = protocol.DataProto.from_single_dict(to_verl(rows, pad_token_id=pad_token_id))
    b = data.batch
    config = ActorConfig(strategy="fsdp", rollout_n=2, ppo_micro_batch_size_per_gpu=1,
                         ppo_mini_batch_size=1)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(2):
        loss, _ = core_algos.compute_policy_loss_vanilla(
            old_log_prob=b["old_log_probs"], log_prob=verl_log_prob(model, b),
            advantages=b["advantages"], response_mask=b["response_mask"],
            loss_agg_mode="token-mean", config=config)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert all(math.isfinite(x) for x in losses) and losses[1] != losses[0], losses
    return losses


def test_two_optimizer_steps_with_verls_loss_on_the_dataproto() -> None:
    verl_two_steps(group_rows(), tiny_model(2), PAD)
