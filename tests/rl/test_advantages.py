"""GRPO / Dr.GRPO / RLOO over episodes and the broadcast to segments (RL_EXPORT.md Ex. 3)."""

from __future__ import annotations

import statistics

import pytest

from agentcompact.errors import ConfigError, ExportError
from agentcompact.rl import (
    assign_advantages,
    broadcast_to_segments,
    drgrpo_advantages,
    grpo_advantages,
    rloo_advantages,
    validate_rows,
)

from .rowkit import make_episode

SQRT_HALF = 0.7071  # RL_EXPORT.md Example 3, 4 decimals


def example3_rows() -> list[dict]:
    """Group {E1: R=1, 3 segments; E2: R=0, 1 segment}."""
    e1 = make_episode("E1", [[1, 1], [0, 1, 1], [1, 0, 1]], reward=1.0, sample_index=0, seed=1)
    e2 = make_episode("E2", [[1, 0, 1]], reward=0.0, sample_index=1, seed=2)
    return e1 + e2


def naive_row_grpo(row_rewards: list[float]) -> list[float]:
    """The *wrong* statistics: GRPO over rows, as a row-level trainer would compute them."""
    mean, sd = statistics.mean(row_rewards), statistics.stdev(row_rewards)
    return [(r - mean) / sd for r in row_rewards]


def test_example3_correct_advantages_are_per_episode() -> None:
    adv = grpo_advantages(example3_rows())
    assert adv["E1"] == pytest.approx(SQRT_HALF, abs=1e-4)
    assert adv["E2"] == pytest.approx(-SQRT_HALF, abs=1e-4)


def test_example3_broadcast_gives_every_segment_of_the_win_the_same_advantage() -> None:
    rows = broadcast_to_segments(example3_rows(), grpo_advantages(example3_rows()))
    validate_rows(rows)
    for row in rows:
        sign = 1.0 if row["episode_id"] == "E1" else -1.0
        for m, a in zip(row["response_mask"], row["advantages"], strict=True):
            assert a == (pytest.approx(sign * SQRT_HALF, abs=1e-4) if m else 0.0)
    e1_first_tokens = [r["advantages"][r["response_mask"].index(1)] for r in rows[:3]]
    assert all(a > 0 for a in e1_first_tokens)


def test_example3_wrong_row_statistics_with_copied_reward() -> None:
    rows = example3_rows()
    wrong = naive_row_grpo([float(r["episode_reward"]) for r in rows])
    assert wrong == pytest.approx([0.5, 0.5, 0.5, -1.5])
    correct = [grpo_advantages(rows)[r["episode_id"]] for r in rows]
    assert correct != pytest.approx(wrong, abs=1e-3)


def test_example3_wrong_reward_only_on_last_row() -> None:
    rows = example3_rows()
    last_only = [float(r["episode_reward"]) if r["is_last_segment"] else 0.0 for r in rows]
    wrong = naive_row_grpo(last_only)
    assert wrong == pytest.approx([-0.5, -0.5, 1.5, -0.5])
    # It pushes down the early segments of a win; the episode statistics do not.
    assert wrong[0] < 0 < grpo_advantages(rows)["E1"]


def test_unbiased_std_by_hand() -> None:
    eps = [{"group_id": "g", "episode_id": f"e{i}", "episode_reward": r}
           for i, r in enumerate([0.0, 0.0, 3.0])]
    # mean 1, unbiased variance (1 + 1 + 4) / 2 = 3
    adv = grpo_advantages(eps, eps=0.0)
    assert adv["e2"] == pytest.approx(2 / 3**0.5)
    assert adv["e0"] == pytest.approx(-1 / 3**0.5)


def test_singleton_group_has_mean_zero_std_one() -> None:
    adv = grpo_advantages([{"group_id": "solo", "episode_id": "x", "episode_reward": 0.3}])
    assert adv["x"] == pytest.approx(0.3 / (1 + 1e-6))


def test_groups_are_independent() -> None:
    eps = [{"group_id": g, "episode_id": f"{g}{i}", "episode_reward": r}
           for g, rs in (("a", [1.0, 0.0]), ("b", [5.0, 7.0])) for i, r in enumerate(rs)]
    adv = grpo_advantages(eps)
    assert adv["a0"] == pytest.approx(SQRT_HALF, abs=1e-4)
    assert adv["b1"] == pytest.approx(SQRT_HALF, abs=1e-4)


def test_drgrpo_does_not_divide_by_std() -> None:
    eps = [{"group_id": "g", "episode_id": e, "episode_reward": r}
           for e, r in (("a", 1.0), ("b", 0.0), ("c", 0.0))]
    adv = drgrpo_advantages(eps)
    assert [adv[e] for e in "abc"] == pytest.approx([2 / 3, -1 / 3, -1 / 3])


def test_rloo_uses_the_mean_of_the_others() -> None:
    eps = [{"group_id": "g", "episode_id": e, "episode_reward": r}
           for e, r in (("a", 1.0), ("b", 0.0), ("c", 0.5))]
    adv = rloo_advantages(eps)
    assert [adv[e] for e in "abc"] == pytest.approx([1 - 0.25, 0 - 0.75, 0.5 - 0.5])
    assert rloo_advantages([{"group_id": "s", "episode_id": "z", "episode_reward": 2.0}]) == {
        "z": 2.0
    }


def test_masked_episode_counts_in_the_group_but_gets_zero_advantage() -> None:
    rows = make_episode("W", [[1, 1]], reward=1.0, seed=3) + make_episode(
        "M", [[1, 0], [1, 1]], reward=0.0, sample_index=1, mask_episode=True, seed=4
    )
    out = assign_advantages(rows)
    validate_rows(out)
    assert out[0]["advantages"] == pytest.approx([SQRT_HALF] * 2, abs=1e-4)
    assert all(a == 0.0 for r in out[1:] for a in r["advantages"])


def test_broadcast_does_not_mutate_input_and_writes_float32() -> None:
    rows = example3_rows()
    before = [list(r["advantages"]) for r in rows]
    out = broadcast_to_segments(rows, {"E1": 1 / 3, "E2": -1 / 3})
    assert [r["advantages"] for r in rows] == before
    assert out[0]["advantages"][0] != 1 / 3  # rounded to float32
    assert out[0]["advantages"][0] == pytest.approx(1 / 3, rel=1e-7)


def test_errors() -> None:
    rows = example3_rows()
    with pytest.raises(ExportError, match="E1"):
        broadcast_to_segments(rows, {"E2": 1.0})
    bad = [dict(rows[0], episode_reward=0.5)] + rows[1:]
    with pytest.raises(ExportError, match="episode_reward"):
        grpo_advantages(bad)
    with pytest.raises(ConfigError, match="ppo"):
        assign_advantages(rows, estimator="ppo")  # type: ignore[arg-type]  # deliberate
