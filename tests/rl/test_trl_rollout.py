"""TRL's GRPOTrainer trains on compacted episodes sampled in its own loop with its current
weights: ``compacting_rollout_func`` (transformers generate on the unwrapped policy) and
``SegmentGRPOTrainer`` (rows padded with zero-mask rows to ``steps_per_generation``)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("trl")
pytest.importorskip("datasets")

from agentcompact.errors import ConfigError  # noqa: E402
from agentcompact.rl.rollout import (  # noqa: E402
    CompactingRollout,
    RolloutSettings,
    SamplingSettings,
    TriggerDraw,
)
from agentcompact.trajectory._tokenize import ChatTokenizer  # noqa: E402

from .tinylm import CountingEnv, byte_tokenizer, prompts_dataset, tiny_lm  # noqa: E402


def _trainer(tmp_path: Path, tok: Any, model: Any, rollout: CompactingRollout,
             seen: list[dict[str, Any]], *, steps: int) -> Any:
    from trl import GRPOConfig

    from agentcompact.rl.trl import SegmentGRPOTrainer, compacting_rollout_func

    def make_env(prompt: Any) -> Any:
        turns = 5 if prompt.startswith("task 0") else 2  # rollouts of 2 rows and of 1
        return ([{"role": "system", "content": "count"}, {"role": "user", "content": prompt}],
                CountingEnv(turns=turns, obs_chars=50), None)

    inner = compacting_rollout_func(rollout, make_env)

    def rollout_func(prompts: list[Any], trainer: Any) -> dict[str, Any]:
        out = inner(prompts, trainer)
        seen.append({**out, "drift": _drift(trainer.model, out)})
        return out

    args = GRPOConfig(output_dir=str(tmp_path / "out"), per_device_train_batch_size=1,
                      gradient_accumulation_steps=steps, steps_per_generation=steps,
                      num_generations=2, max_steps=1, learning_rate=1e-2, loss_type="dapo",
                      beta=0.0, logging_steps=1, report_to=[], use_cpu=True, bf16=False,
                      save_strategy="no", max_completion_length=256, seed=0,
                      dataloader_num_workers=0)
    train = prompts_dataset([f"task {i}: " + "q" * 30 for i in range(4)])
    return SegmentGRPOTrainer(model=model, reward_funcs=lambda **kw: [0.0], args=args,
                              train_dataset=train, processing_class=tok,
                              rollout_func=rollout_func)


# TRL 1.16's own GRPOConfig defaults trip transformers 5's deprecation of gradient_checkpointing
@pytest.mark.filterwarnings("ignore::FutureWarning")
def test_trl_trains_compacted_episodes_sampled_with_its_current_weights(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func is "experimental"
    folder = byte_tokenizer(tmp_path / "tok")
    tok = transformers.AutoTokenizer.from_pretrained(str(folder))
    model = tiny_lm(seed=11)
    rollout = CompactingRollout(ChatTokenizer(tok, str(folder)), RolloutSettings(
        trigger=TriggerDraw(300, 0.9, 1.1, seed=2), max_turns=5,
        sampling=SamplingSettings(max_tokens=10)))
    seen: list[dict[str, Any]] = []
    before = [p.detach().clone() for p in model.parameters()]
    trainer = _trainer(tmp_path, tok, model, rollout, seen, steps=4)
    trainer.train()

    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert trainer.state.global_step == 1 and losses and all(math.isfinite(x) for x in losses)
    out = seen[0]
    assert sorted(set(out["prompt_index"])) == [0, 1, 2, 3]  # 2 groups x 2 generations
    rows = len(out["prompt_ids"])
    assert rows > 4 and rows % 4  # compacted, and padded to steps_per_generation=4
    # the rows are the policy's own samples: their logprobs are its logprobs then
    assert out["drift"] < 1e-4
    changed = [not torch.equal(b, p.detach()) for b, p in zip(before, model.parameters(),
                                                             strict=True)]
    assert any(changed)


def _drift(model: Any, out: dict[str, Any]) -> float:
    """The largest difference between a row's recorded logprob and ``model``'s logprob of
    that token, over every sampled token of ``out``."""
    worst = 0.0
    with torch.no_grad():
        for prompt, completion, logprobs, mask in zip(out["prompt_ids"], out["completion_ids"],
                                                      out["logprobs"], out["env_mask"],
                                                      strict=True):
            logits = model(torch.tensor([list(prompt) + list(completion)])).logits
            fresh = torch.log_softmax(logits[0, len(prompt) - 1:-1].float(), -1).gather(
                -1, torch.tensor(completion)[:, None]).squeeze(-1)
            on = torch.tensor(mask, dtype=torch.bool)
            worst = max(worst, float((fresh[on] - torch.tensor(logprobs)[on]).abs().max()))
    return worst


def test_rows_are_padded_to_steps_per_generation_with_zero_mask_rows() -> None:
    from agentcompact.rl.trl import pad_episodes, trl_batch

    output = {"prompt_ids": [[5, 6], [7]], "completion_ids": [[8, 9, 10], [11]],
              "logprobs": [[-0.5, 0.0, -0.2], [-1.0]], "env_mask": [[1, 0, 1], [1]],
              "advantages": [[0.5, 0.5, 0.5], [-0.5]], "episode_id": ["a", "b"],
              "prompt_index": [0, 1]}
    padded = pad_episodes(output, 4, 0)
    assert len(padded["prompt_ids"]) == 4 and padded["env_mask"][2:] == [[0], [0]]
    batch = trl_batch(padded, 0)
    assert batch["tool_mask"].sum() == 3  # the loss tokens are the two rows' own
    assert pad_episodes(output, 2, 0) is output


def test_a_group_split_across_processes_is_refused() -> None:
    from agentcompact.rl.trl import _check_groups

    _check_groups(["a", "a", "b", "b"], 2)
    with pytest.raises(ConfigError, match="multiple of num_generations"):
        _check_groups(["a", "a", "b"], 2)
