"""The chunked log-probabilities and the PPO loss: exactness, gradients, refusals, one step."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("pyarrow")

from agentcompact.errors import ExportError  # noqa: E402
from agentcompact.rl.logprobs import (  # noqa: E402
    chosen_logprobs,
    chosen_logprobs_from_logits,
    response_positions,
)
from agentcompact.rl.ppo import (  # noqa: E402
    collate_step,
    policy_loss,
    policy_loss_from_hidden,
    surrogate,
)
from agentcompact.rl.torch_data import collate  # noqa: E402

from .rowkit import make_episode, make_row  # noqa: E402

PAD = 0
V, H = 37, 8


def _rows() -> list[dict]:
    rows = make_episode("a", [[1, 0, 1, 1], [0, 1, 1]], seed=1)
    rows += make_episode("b", [[1, 1, 0, 0, 1]], sample_index=1, reward=0.0, seed=2)
    for r in rows:
        r["prompt_ids"] = [int(t) % V for t in r["prompt_ids"]]
        r["response_ids"] = [int(t) % V for t in r["response_ids"]]
        r["advantages"] = [0.7 * m if r["episode_id"] == "a" else -0.7 * m
                           for m in r["response_mask"]]
    return rows


def _full(hidden: torch.Tensor, weight: torch.Tensor, batch: dict) -> torch.Tensor:
    """The reference: a full log-softmax over every position, gathered."""
    logp = torch.log_softmax((hidden @ weight.T)[:, :-1], -1)
    logp = logp.gather(-1, batch["input_ids"][:, 1:, None]).squeeze(-1)
    rows, positions = response_positions(batch)
    return logp[rows, positions - 1]


def test_chunked_logprobs_and_gradients_equal_the_full_softmax() -> None:
    torch.manual_seed(0)
    batch = collate(_rows(), PAD)
    b, t = batch["input_ids"].shape
    weight = torch.randn(V, H, dtype=torch.float64, requires_grad=True)
    hidden = torch.randn(b, t, H, dtype=torch.float64, requires_grad=True)
    want = _full(hidden, weight, batch)
    got, _, _ = chosen_logprobs(hidden, weight, batch, token_chunk=3, vocab_chunk=5)
    assert torch.allclose(got.double(), want, atol=1e-5)
    g = torch.randn_like(want)
    gh_want, gw_want = torch.autograd.grad((want * g).sum(), (hidden, weight))
    gh, gw = torch.autograd.grad((got * g).sum(), (hidden, weight))
    assert torch.allclose(gh, gh_want, atol=1e-5) and torch.allclose(gw, gw_want, atol=1e-5)
    logits = (hidden @ weight.T).detach()
    from_logits, _, _ = chosen_logprobs_from_logits(logits, batch, token_chunk=2)
    assert torch.allclose(from_logits.double(), want, atol=1e-5)


def test_gradients_reach_exactly_the_logits_of_mask_1_tokens() -> None:
    batch = collate(_rows(), PAD)
    logits = torch.randn(*batch["input_ids"].shape, V, requires_grad=True)
    policy_loss(logits, batch, old_logprobs="detached").backward()  # ratio 1: nothing clipped
    touched = (logits.grad.abs().sum(-1) > 0)
    want = torch.zeros_like(touched)
    want[:, :-1] = batch["loss_mask"][:, 1:] > 0  # logit t-1 predicts token t
    assert torch.equal(touched, want)


def test_dual_clip_bounds_the_loss_of_negative_advantages() -> None:
    logp, old = torch.tensor([0.0, 0.0, 0.0]), torch.log(torch.tensor([0.1, 0.1, 0.1]))
    adv = torch.tensor([-1.0, 1.0, -1.0])  # ratio 10
    out = surrogate(logp, old, adv, clip_ratio_c=3.0)
    assert out.tolist() == pytest.approx([3.0, -1.2, 3.0])
    assert surrogate(logp, old, adv, clip_ratio_c=None).tolist() == pytest.approx([10, -1.2, 10])


def test_a_row_without_rollout_logprobs_is_refused_by_name() -> None:
    rows = _rows()
    rows[1]["sampling"] = dict(rows[1]["sampling"], logprobs_mode="none")
    batch = collate(rows, PAD)
    logits = torch.randn(*batch["input_ids"].shape, V)
    with pytest.raises(ExportError, match="episode 'a' segment 1.*recompute-logprobs"):
        policy_loss(logits, batch)
    assert torch.isfinite(policy_loss(logits, batch, old_logprobs="detached"))


def test_micro_batches_of_one_step_sum_to_the_loss_of_the_whole_step() -> None:
    rows = _rows() + [make_row(episode_id="c", sample_index=2, group_id="g0",
                               advantages=[0.3, 0.0, 0.3])]
    torch.manual_seed(1)
    hidden_of = {}
    weight = torch.randn(V, H)
    whole = collate(rows, PAD, max_len=5)
    hidden = torch.randn(*whole["input_ids"].shape, H)
    for mode in ("token-mean", "seq-mean-token-mean", "episode-mean-token-mean"):
        whole = collate(rows, PAD, mode, max_len=5)
        want = policy_loss_from_hidden(hidden, weight, whole).item()
        parts = collate_step(rows, PAD, micro_batch_size=1, mode=mode, max_len=5)
        total = 0.0
        for b, part in enumerate(parts):
            width = part["input_ids"].shape[1]
            hidden_of[b] = hidden[b:b + 1, :width]
            total += policy_loss_from_hidden(hidden_of[b], weight, part).item()
        assert total == pytest.approx(want, rel=1e-5), mode
        local = sum(policy_loss_from_hidden(hidden_of[b], weight, collate([r], PAD, mode)).item()
                    for b, r in enumerate(rows))
        if mode == "token-mean":  # per-micro-batch normalisers give another objective
            assert local != pytest.approx(want, rel=1e-3)


def test_step_normalizer_all_reduces_when_distributed(tmp_path) -> None:
    import torch.distributed as dist

    from agentcompact.rl.ppo import step_normalizer

    rows = _rows()
    local = step_normalizer(rows, "token-mean")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0,
                            world_size=1)
    try:  # one rank: the all-reduced count over the world size is the local count
        assert step_normalizer(rows, "token-mean") == local == sum(
            sum(r["response_mask"]) for r in rows)
        assert step_normalizer(rows, "constant-norm", max_len=7) == len(rows) * 7
    finally:
        dist.destroy_process_group()
