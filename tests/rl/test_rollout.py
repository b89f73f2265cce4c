"""CompactingRollout: one episode in a trainer's loop, token in / token out, its rows the
exporter's own. The sampler here is an inference engine that always answers the same
tokens (the trainers' tests sample a real tiny model)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyarrow")
transformers = pytest.importorskip("transformers")

from agentcompact import StrategySettings, Summarizer  # noqa: E402
from agentcompact.errors import ConfigError  # noqa: E402
from agentcompact.plugins.recorder import Recorder  # noqa: E402
from agentcompact.rl import validate_rows  # noqa: E402
from agentcompact.rl.rollout import (  # noqa: E402
    CompactingRollout,
    RolloutSettings,
    Sample,
    SamplingSettings,
    Step,
    TriggerDraw,
    write_batch,
)
from agentcompact.trajectory._tokenize import ChatTokenizer  # noqa: E402

from .tinylm import CountingEnv, byte_tokenizer  # noqa: E402

TASK = [{"role": "system", "content": "count"}, {"role": "user", "content": "task: " + "q" * 40}]


@pytest.fixture(scope="module")
def tok(tmp_path_factory: pytest.TempPathFactory) -> ChatTokenizer:
    folder = byte_tokenizer(tmp_path_factory.mktemp("tok"))
    return ChatTokenizer.from_pretrained(str(folder))


class Fixed:
    """An engine answering ``text`` every time (with its stop token unless ``stop`` is
    off), each token scored -0.5; it keeps the prompts it was given."""

    def __init__(self, tok: ChatTokenizer, text: str = "ok then", stop: bool = True) -> None:
        self.ids = tok.encode(text) + ([tok.hf.convert_tokens_to_ids("<|im_end|>")] if stop
                                       else [])
        self.prompts: list[list[int]] = []

    async def __call__(self, prompt_ids: list[int], settings: SamplingSettings) -> Sample:
        self.prompts.append(list(prompt_ids))
        return Sample(list(self.ids), [-0.5] * len(self.ids),
                      "stop" if len(self.ids) else "length")


def _run(rollout: CompactingRollout, sampler: Any, turns: int = 6, **kw: Any) -> Any:
    return asyncio.run(rollout.run(TASK, CountingEnv(turns=turns, obs_chars=60), sampler,
                                   group_id=kw.pop("group_id", "g"), **kw))


def test_prompts_extend_by_the_sampled_ids_until_a_compaction(tok: ChatTokenizer) -> None:
    rollout = CompactingRollout(tok, RolloutSettings(trigger=260, max_turns=6))
    sampler = Fixed(tok)
    episode = _run(rollout, sampler)
    rows = episode.rows
    assert len(rows) >= 2 and episode.compactions >= 1
    assert rows[0]["compaction_trigger"] == "token_budget"
    validate_rows([dict(r) for r in rows])
    # within a segment each prompt is the previous prompt + its sampled ids + glue
    starts = [list(r["prompt_ids"]) for r in rows]
    extended = 0
    for before, after in zip(sampler.prompts, sampler.prompts[1:], strict=False):
        if after in starts:
            continue  # a fresh render: a new segment (after a compaction)
        assert after[: len(before) + len(sampler.ids)] == before + sampler.ids
        extended += 1
    assert extended >= 2
    # the sampled tokens are mask 1 with their logprobs; the glue and observations mask 0
    row = rows[0]
    pairs = list(zip(row["response_mask"], row["rollout_logprobs"], strict=True))
    assert {lp for m, lp in pairs if m} == {-0.5} and {lp for m, lp in pairs if not m} == {0.0}
    assert row["response_mask"][-1] == 1


def test_an_end_of_turn_not_sampled_is_added_as_glue(tok: ChatTokenizer) -> None:
    rollout = CompactingRollout(tok, RolloutSettings(trigger=100_000, max_turns=3))
    sampler = Fixed(tok, stop=False)
    episode = _run(rollout, sampler, turns=3)
    assert len(episode.rows) == 1
    eos = tok.hf.convert_tokens_to_ids("<|im_end|>")
    first, second = sampler.prompts[:2]
    glue = second[len(first) + len(sampler.ids):]
    assert glue[0] == eos  # closed for the policy, not sampled by it
    response = list(episode.rows[0]["response_ids"])
    mask = list(episode.rows[0]["response_mask"])
    assert mask[response.index(eos)] == 0


def test_one_trigger_per_group_drawn_from_the_seed() -> None:
    draw = TriggerDraw(10_000, 0.5, 1.5, seed=3)
    assert draw("a") == draw("a") and draw("a") != draw("b")
    assert all(5_000 <= draw(g) <= 15_000 for g in "abcdefgh")
    assert TriggerDraw(10_000, 0.5, 1.5, seed=4)("a") != draw("a")
    assert TriggerDraw(10_000)("a") == 10_000
    with pytest.raises(ConfigError):
        TriggerDraw(10_000, 1.5, 0.5)


def test_episode_rows_and_their_group_advantages(tok: ChatTokenizer) -> None:
    rollout = CompactingRollout(tok, RolloutSettings(trigger=260, max_turns=6))

    class Rewarded(CountingEnv):
        def __init__(self, reward: float) -> None:
            super().__init__(turns=4, obs_chars=60)
            self.reward = reward

        async def step(self, text: str, sample: Any) -> Step:
            step = await super().step(text, sample)
            return Step(step.observations, self.reward if step.done else None, step.done)

    async def group() -> list[Any]:
        return list(await asyncio.gather(*[
            rollout.run(TASK, Rewarded(r), Fixed(tok), group_id="g", sample_index=i)
            for i, r in enumerate((1.0, 0.0))]))

    batch = rollout.rows(asyncio.run(group()))
    signs = {r["episode_id"]: {float(a) for a, m in zip(r["advantages"], r["response_mask"],
                                                       strict=True) if m} for r in batch.rows}
    assert sorted(min(v) for v in signs.values()) == pytest.approx([-0.7071, 0.7071], abs=1e-3)
    assert all(len(v) == 1 for v in signs.values())  # one advantage per episode, every row


def test_rows_written_equal_the_export_of_the_recorded_events(tok: ChatTokenizer,
                                                              tmp_path: Path) -> None:
    from agentcompact import new_plugin_manager
    from agentcompact.trajectory.export import export_runs

    pm = new_plugin_manager()
    recorder = Recorder(tmp_path / "run")
    pm.register(recorder)
    rollout = CompactingRollout(tok, RolloutSettings(trigger=260, max_turns=6), plugins=pm)
    episodes = [_run(rollout, Fixed(tok), group_id=g, sample_index=i)
                for g, i in (("g", 0), ("g", 1), ("h", 0))]
    recorder.close()
    write_batch(rollout.rows(episodes), tmp_path / "ours")
    export_runs([tmp_path / "run"], tmp_path / "export", tok)
    for name in ("segments-00000.parquet", "episodes.parquet"):
        assert (tmp_path / "ours" / name).read_bytes() == \
            (tmp_path / "export" / name).read_bytes()


def test_a_task_longer_than_the_context_is_refused_by_name(tok: ChatTokenizer) -> None:
    rollout = CompactingRollout(tok, RolloutSettings(max_context=20))
    with pytest.raises(ConfigError, match="max_context 20"):
        _run(rollout, Fixed(tok))


def test_the_policys_own_summaries_are_trained_rows(tok: ChatTokenizer) -> None:
    """The summary strategy with the policy as summarizer (``trained``): its summary is a
    segment of its own, mask 1, on the server's ids and logprobs."""
    from agentcompact.testing import UpstreamSim, serve

    sim = UpstreamSim(tokenizer=tok.hf)
    with serve(sim.app) as server:
        summarizer = Summarizer(base_url=f"{server.base_url}/v1", model="policy",
                                trained=True, return_token_ids=True)
        rollout = CompactingRollout(tok, RolloutSettings(
            strategy=StrategySettings("summary", summarizer=summarizer), trigger=1200,
            max_turns=24))
        episode = _run(rollout, Fixed(tok), turns=24)
    trained = [r for r in episode.rows if r["summary_trained"]]
    assert trained, [r["segment_break"] for r in episode.rows]
    row = trained[0]
    start, end = row["summary_span"]
    assert set(row["response_mask"][start:end]) == {1}
    assert row["sampling"]["logprobs_mode"] != "none"
