"""Loss aggregation modes as per-token weights (RL_EXPORT.md Examples 1 and 2)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentcompact.errors import ConfigError, ExportError
from agentcompact.rl import LOSS_MODES, aggregate, token_weights, weights_for_rows

from .rowkit import make_episode


def loss_of(losses: list[list[float]], mode: str, **kw) -> float:
    masks = [[1] * len(x) for x in losses]
    return aggregate(losses, token_weights(masks, mode, **kw))


# Example 1: rows A ℓ=[1,3], B ℓ=[4,4,4,4] (padded length 4).
EX1 = [[1.0, 3.0], [4.0, 4.0, 4.0, 4.0]]


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("token-mean", 3.3333),
        ("seq-mean-token-sum", 10.0),
        ("seq-mean-token-mean", 3.0),
        ("constant-norm", 2.5),
        ("dr-grpo", 2.5),
    ],
)
def test_example1(mode: str, expected: float) -> None:
    assert loss_of(EX1, mode, max_len=4) == pytest.approx(expected, abs=1e-4)


# Example 2: episode A = one row [1,3]; episode B = [2,6,6,6] split into [2] and [6,6,6].
EX2_SPLIT = [[1.0, 3.0], [2.0], [6.0, 6.0, 6.0]]
EX2_EPISODES = ["A", "B", "B"]
EX2_UNSPLIT = [[1.0, 3.0], [2.0, 6.0, 6.0, 6.0]]


def test_example2_token_mean_is_unchanged_by_splitting() -> None:
    assert loss_of(EX2_SPLIT, "token-mean") == pytest.approx(4.0)
    assert loss_of(EX2_UNSPLIT, "token-mean") == pytest.approx(4.0)


def test_example2_seq_mean_token_mean_changes_when_split() -> None:
    assert loss_of(EX2_SPLIT, "seq-mean-token-mean") == pytest.approx(3.3333, abs=1e-4)
    assert loss_of(EX2_UNSPLIT, "seq-mean-token-mean") == pytest.approx(3.5)


def test_example2_episode_mean_token_mean_restores_unsplit() -> None:
    got = loss_of(EX2_SPLIT, "episode-mean-token-mean", episode_ids=EX2_EPISODES)
    assert got == pytest.approx(3.5)
    with_counts = loss_of(EX2_SPLIT, "episode-mean-token-mean", episode_ids=EX2_EPISODES,
                          episode_num_loss_tokens=[2, 4, 4])
    assert with_counts == pytest.approx(3.5)


def test_example2_row_weight_one_over_nseg_is_a_different_objective() -> None:
    got = loss_of(EX2_SPLIT, "seq-mean-token-mean", loss_weights=[1.0, 0.5, 0.5])
    assert got == pytest.approx(3.0)


def test_weights_for_rows_drop_masked_episodes_from_the_normaliser() -> None:
    rows = make_episode("a", [[1, 0, 1]]) + make_episode(
        "m", [[1, 1, 1, 1]], sample_index=1, mask_episode=True, seed=2
    )
    w = weights_for_rows(rows, "token-mean")
    assert w[0].tolist() == [0.5, 0.0, 0.5]  # 2 loss tokens, not 6
    assert w[1].tolist() == [0.0] * 4


def test_episode_mode_uses_the_episode_token_count_from_the_rows() -> None:
    # Only the first segment of a 2-segment episode is in this mini-batch.
    first = make_episode("e", [[1, 1], [1, 1, 1, 1, 1, 1]])[0]
    (w,) = weights_for_rows([first], "episode-mean-token-mean")
    assert w.tolist() == pytest.approx([1 / 8, 1 / 8])


def test_loss_weight_zero_drops_a_row_in_every_normalised_mode() -> None:
    for mode in ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean"):
        got = loss_of(EX1 + [[100.0]], mode, loss_weights=[1.0, 1.0, 0.0])
        assert got == pytest.approx(loss_of(EX1, mode)), mode


def test_errors_and_empty() -> None:
    with pytest.raises(ConfigError, match="mean-of-means"):
        token_weights([[1]], "mean-of-means")
    with pytest.raises(ExportError):
        token_weights([[1], [1]], "episode-mean-token-mean")
    with pytest.raises(ExportError, match="loss weights"):
        token_weights([[1], [1]], "episode-mean-token-mean", episode_ids=["a", "a"],
                      loss_weights=[1.0, 2.0])
    for mode in LOSS_MODES:
        w = token_weights([[0, 0]], mode, episode_ids=["a"])
        assert w[0].tolist() == [0.0, 0.0]


episodes_strategy = st.lists(
    st.lists(st.tuples(st.floats(-5, 5), st.integers(0, 1)), min_size=1, max_size=8),
    min_size=1, max_size=5,
)


def split_episodes(episodes, cuts):
    """Rows after cutting each episode at the given fractions (possibly into 1 row)."""
    losses, masks, ids = [], [], []
    for e, (tokens, cut_fracs) in enumerate(zip(episodes, cuts, strict=False)):
        points = sorted({int(f * len(tokens)) for f in cut_fracs} - {0})
        bounds = [0, *points, len(tokens)]
        for lo, hi in zip(bounds, bounds[1:], strict=False):
            if hi > lo:
                losses.append([x for x, _ in tokens[lo:hi]])
                masks.append([m for _, m in tokens[lo:hi]])
                ids.append(f"e{e}")
    return losses, masks, ids


@settings(max_examples=80, deadline=None)
@given(episodes=episodes_strategy,
       cuts=st.lists(st.lists(st.floats(0, 1), max_size=3), min_size=5, max_size=5))
def test_splitting_never_changes_token_mean_and_episode_mode_equals_unsplit(
    episodes, cuts
) -> None:
    whole_l = [[x for x, _ in ep] for ep in episodes]
    whole_m = [[m for _, m in ep] for ep in episodes]
    losses, masks, ids = split_episodes(episodes, cuts)

    def agg(ls, ms, mode, **kw):
        return aggregate(ls, token_weights(ms, mode, **kw))

    assert agg(losses, masks, "token-mean") == pytest.approx(
        agg(whole_l, whole_m, "token-mean"), abs=1e-9)
    assert agg(losses, masks, "episode-mean-token-mean", episode_ids=ids) == pytest.approx(
        agg(whole_l, whole_m, "seq-mean-token-mean"), abs=1e-9)
    whole_ids = [f"e{i}" for i in range(len(episodes))]
    assert agg(whole_l, whole_m, "episode-mean-token-mean", episode_ids=whole_ids) == (
        pytest.approx(agg(whole_l, whole_m, "seq-mean-token-mean"), abs=1e-9))
