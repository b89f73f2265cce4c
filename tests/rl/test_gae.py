"""verl GAE, chain / truncated GAE and whitening (RL_EXPORT.md Examples 4, 4b, 5)."""

from __future__ import annotations

import statistics

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from agentcompact.errors import ExportError
from agentcompact.rl._gae import (
    assign_gae,
    chain_gae,
    gae,
    masked_whiten,
    token_rewards,
    truncated_chain_gae,
)

from .rowkit import make_episode

G, L = 0.9, 0.8  # gamma, lambda of Examples 4 and 5
S1 = ([0.0, 0.0], [0.5, 0.6], [1, 1])
S2 = ([0.0, 1.0], [0.7, 0.8], [1, 1])


def verl_gae_batch(r: torch.Tensor, v: torch.Tensor, m: torch.Tensor, gamma: float,
                   lam: float) -> torch.Tensor:
    """verl's ``compute_gae_advantage_return`` loop (batched, masked blend), unwhitened."""
    nextvalues = torch.zeros(r.shape[0], dtype=r.dtype)
    lastgaelam = torch.zeros(r.shape[0], dtype=r.dtype)
    reversed_adv = []
    for t in reversed(range(r.shape[1])):
        delta = r[:, t] + gamma * nextvalues - v[:, t]
        lastgaelam_ = delta + gamma * lam * lastgaelam
        nextvalues = v[:, t] * m[:, t] + (1 - m[:, t]) * nextvalues
        lastgaelam = lastgaelam_ * m[:, t] + (1 - m[:, t]) * lastgaelam
        reversed_adv.append(lastgaelam)
    return torch.stack(reversed_adv[::-1], dim=1)


def test_example4_observation_tokens_are_transparent() -> None:
    adv, ret = gae([0, 0, 0, 1], [0.5, 123.0, 0.6, 0.7], [1, 0, 1, 1], G, L)
    assert adv[[0, 2, 3]] == pytest.approx([0.2171, 0.246, 0.3], abs=1e-4)
    assert ret[0] == pytest.approx(adv[0] + 0.5)


def test_example4b_reward_on_a_mask0_token_is_lost() -> None:
    adv, _ = gae([0, 0, 1], [0.5, 0.6, 0.9], [1, 1, 0], G, L)
    assert adv[:2] == pytest.approx([-0.392, -0.6])


def test_example5_chain() -> None:
    (a1, r1), (a2, _) = chain_gae([S1, S2], G, L)
    assert a1 == pytest.approx([0.1466, 0.1481], abs=1e-4)
    assert a2 == pytest.approx([0.164, 0.2])
    assert r1 == pytest.approx([0.6466, 0.7481], abs=1e-4)


def test_example5_truncated_and_independent() -> None:
    (a1, _), (a2, _) = truncated_chain_gae([S1, S2], G, L)
    assert a1 == pytest.approx([0.0616, 0.03])
    assert a2 == pytest.approx([0.164, 0.2])
    independent, _ = gae(*S1, G, L)  # V = 0 terminal at the boundary: wrong
    assert independent == pytest.approx([-0.392, -0.6])


segments_strategy = st.lists(
    st.integers(1, 6).flatmap(lambda n: st.tuples(
        st.lists(st.floats(-2, 2), min_size=n, max_size=n),
        st.lists(st.floats(-2, 2), min_size=n, max_size=n),
        st.lists(st.integers(0, 1), min_size=n, max_size=n),
    )),
    min_size=1, max_size=4,
)


@settings(max_examples=60, deadline=None)
@given(segments=segments_strategy, gamma=st.floats(0.5, 1.0), lam=st.floats(0.0, 1.0))
def test_chain_gae_equals_verl_gae_on_the_concatenated_chain(segments, gamma, lam) -> None:
    cat = [torch.tensor([x for seg in segments for x in seg[i]], dtype=torch.float64)[None]
           for i in range(3)]
    expected = verl_gae_batch(*cat, gamma, lam)[0].numpy()
    got = np.concatenate([a for a, _ in chain_gae(segments, gamma, lam)])
    mask = cat[2][0].numpy() == 1
    np.testing.assert_allclose(got[mask], expected[mask], rtol=1e-9, atol=1e-9)


@settings(max_examples=60, deadline=None)
@given(segments=segments_strategy)
def test_gamma_lambda_one_gives_return_minus_value(segments) -> None:
    r = [x for seg in segments for x in seg[0]]
    v = [x for seg in segments for x in seg[1]]
    m = [x for seg in segments for x in seg[2]]
    adv = np.concatenate([a for a, _ in chain_gae(segments, 1.0, 1.0)])
    for t in (t for t in range(len(m)) if m[t]):
        ret = sum(r[s] for s in range(t, len(m)) if m[s])  # rewards on mask-0 tokens are lost
        assert adv[t] == pytest.approx(ret - v[t], abs=1e-9)


def test_masked_whiten() -> None:
    adv = [np.array([1.0, 50.0, 2.0]), np.array([4.0])]
    out = masked_whiten(adv, [[1, 0, 1], [1]])
    kept = [1.0, 2.0, 4.0]
    mean, sd = statistics.mean(kept), statistics.stdev(kept)
    assert out[0] == pytest.approx([(1 - mean) / sd, 0.0, (2 - mean) / sd], rel=1e-6)
    assert out[1] == pytest.approx([(4 - mean) / sd], rel=1e-6)
    unshifted = masked_whiten(adv, [[1, 0, 1], [1]], shift_mean=False)
    assert unshifted[1][0] == pytest.approx((4 - mean) / sd + mean, rel=1e-6)
    with pytest.raises(ExportError):
        masked_whiten([np.array([1.0])], [[1]])


def test_token_rewards_place_the_reward_on_the_last_mask1_token() -> None:
    first, last = make_episode("e", [[1, 1, 0], [1, 0, 1, 0, 1]], reward=2.5)
    first = dict(first, segment_reward=0.25)
    assert token_rewards(first).tolist() == [0.0, 0.25, 0.0]
    assert token_rewards(last).tolist() == [0.0, 0.0, 0.0, 0.0, 2.5]


def test_assign_gae_on_rows_reproduces_example5() -> None:
    rows = make_episode("e", [[1, 1], [1, 1]], reward=1.0)
    out = assign_gae(rows, [[0.5, 0.6], [0.7, 0.8]], gamma=G, lam=L, whiten=False)
    assert out[0]["advantages"] == pytest.approx([0.1466, 0.1481], abs=1e-4)
    assert out[1]["advantages"] == pytest.approx([0.164, 0.2], rel=1e-6)
    assert out[0]["returns"] == pytest.approx([0.6466, 0.7481], abs=1e-4)


def test_assign_gae_zeroes_mask0_and_masked_episodes_and_whitens() -> None:
    rows = make_episode("a", [[1, 0, 1], [1, 1]], reward=1.0) + make_episode(
        "b", [[0, 1, 1]], reward=0.0, sample_index=1, seed=5
    ) + make_episode("m", [[1, 1]], reward=1.0, sample_index=2, mask_episode=True, seed=6)
    values = [[0.1, 0.2, 0.3], [0.4, 0.5], [0.6, 0.7, 0.8], [0.9, 1.0]]
    out = assign_gae(rows, values, gamma=1.0, lam=1.0)
    assert out[0]["advantages"][1] == 0.0 and out[2]["advantages"][0] == 0.0
    assert out[3]["advantages"] == [0.0, 0.0]
    kept = [a for r in out[:3] for a, m in zip(r["advantages"], r["response_mask"],
                                               strict=True) if m]
    assert statistics.mean(kept) == pytest.approx(0.0, abs=1e-6)
    assert statistics.stdev(kept) == pytest.approx(1.0, abs=1e-4)
    with pytest.raises(ExportError):
        assign_gae(rows, values[:2])


def test_assign_gae_chains_segments_by_index_not_by_row_order() -> None:
    """Shuffled rows (TRL shuffles its dataset) give every row the advantages it gets in
    episode order: the chain follows ``segment_index``."""
    rows = make_episode("e", [[1, 1], [1, 1], [1, 0, 1]], reward=1.0) + make_episode(
        "f", [[1], [1, 1]], reward=0.0, sample_index=1, seed=3)
    values = [[0.5, 0.6], [0.7, 0.8], [0.1, 0.2, 0.3], [0.4], [0.2, 0.9]]
    ordered = assign_gae(rows, values, gamma=G, lam=L, whiten=False)
    shuffle = [4, 2, 0, 3, 1]
    shuffled = assign_gae([rows[i] for i in shuffle], [values[i] for i in shuffle],
                          gamma=G, lam=L, whiten=False)
    for got, i in zip(shuffled, shuffle, strict=True):
        assert got["advantages"] == ordered[i]["advantages"]
        assert got["returns"] == ordered[i]["returns"]


@pytest.mark.parametrize("indices, problem", [
    ([0, 0], "duplicate segment_index"),
    ([0, 2], r"segment indices \[0, 2\] are not 0\.\.1")])
def test_assign_gae_refuses_duplicate_or_missing_segments(indices: list[int],
                                                          problem: str) -> None:
    rows = [dict(r, segment_index=i) for r, i in
            zip(make_episode("e", [[1], [1]]), indices, strict=True)]
    with pytest.raises(ExportError, match=f"episode 'e': {problem}"):
        assign_gae(rows, [[0.1], [0.2]], whiten=False)
