"""The closed loop (torch): the live policy's rollouts through the engine with its own
summaries, recorded through the hooks, rows in memory, trained with the project's loss."""

from __future__ import annotations

import functools
import random
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("pyarrow")

from agentcompact import LocalSummarizer, SummaryOutput, new_plugin_manager  # noqa: E402
from agentcompact.errors import ConfigError, SummarizerError  # noqa: E402
from agentcompact.rl import validate_rows  # noqa: E402
from agentcompact.rl._loop import Lockstep, TorchPolicy, end_episode, play  # noqa: E402
from agentcompact.rl.demo import DemoConfig, _model, _Setup  # noqa: E402
from agentcompact.trajectory import EpisodeCollector, rows_from_events  # noqa: E402

SMALL = DemoConfig(fillers=8, groups=2, samples=2)


@pytest.fixture(scope="module")
def setup() -> _Setup:
    return _Setup(SMALL)


def _rollouts(setup: _Setup, *, trained: bool, version: int, seed: int = 0,
              episodes: int = 4) -> tuple[list[Any], list[float]]:
    """``episodes`` rollouts of one task by a random policy of ``version``, in lockstep."""
    model = _model(setup, seed)
    policy = TorchPolicy(model, setup.hf, generator=torch.Generator().manual_seed(seed))
    policy.version = version
    pm = new_plugin_manager()
    collector = EpisodeCollector()
    pm.register(collector)
    summarizer = policy.summarizer(4, trained=trained)
    engines = [setup.engine(setup.summary_strategy(summarizer), pm) for _ in range(episodes)]
    spec = setup.task.sample(random.Random(seed))

    def episode(n: int) -> float:
        eid = f"e{n}"
        answer = play(engines[n], policy, setup.task.head(), setup.steps(spec), episode_id=eid,
                      group_id="g", respond=setup.respond, max_new=4)
        end_episode(engines[n], eid, "g", n, float(n % 2), {"answer": answer})
        return float(n % 2)

    rewards = Lockstep(policy).run([functools.partial(episode, n) for n in range(episodes)])
    order = {f"e{n}": n for n in range(episodes)}
    return sorted(collector.finished(), key=lambda e: order[e.episode_id]), rewards


def test_a_loop_records_the_policy_version_and_the_summaries_as_sampled(setup: _Setup) -> None:
    """Every row of a rollout of policy version 3 says 3, the policy's own summaries are
    rows trained at the temperature they were sampled at, with the sampled logprobs."""
    episodes, _ = _rollouts(setup, trained=True, version=3)
    assert all(sum(1 for k, _ in e.items if k == "compaction") >= 2 for e in episodes)
    rows = rows_from_events(episodes, setup.chat).rows
    validate_rows(rows, tokenizer_sha256=setup.chat.tokenizer_sha256)
    assert {r["policy_version"] for r in rows} == {3}
    summaries = [r for r in rows if r["summary_trained"]]
    assert summaries and all(r["sampling"]["temperature"] == 1.0 for r in summaries)
    assert all(r["sampling"]["logprobs_mode"] == "raw" for r in rows)
    sampled = [v for e in episodes for k, v in e.items if k == "summary_call"]
    assert all(v.policy_version == 3 and v.request == {"temperature": 1.0} for v in sampled)


def test_a_frozen_summarizer_is_not_trained(setup: _Setup) -> None:
    episodes, _ = _rollouts(setup, trained=False, version=0)
    rows = rows_from_events(episodes, setup.chat).rows
    assert not any(r["summary_trained"] for r in rows)
    assert sum(1 for e in episodes for k, _ in e.items if k == "summary_call") >= 2 * len(
        episodes)


def test_lockstep_sampling_does_not_depend_on_thread_timing(setup: _Setup) -> None:
    first, _ = _rollouts(setup, trained=True, version=0, seed=7)
    again, _ = _rollouts(setup, trained=True, version=0, seed=7)
    ids = [[v.response_token_ids for k, v in e.items if k in ("model_call", "summary_call")]
           for e in first]
    assert ids == [[v.response_token_ids for k, v in e.items
                    if k in ("model_call", "summary_call")] for e in again]


def test_a_local_summarizer_reports_its_calls_and_failures() -> None:
    from agentcompact._summarizer import CallInfo

    calls: list[Any] = []

    class Log:
        from agentcompact import hookimpl

        @hookimpl
        def agentcompact_log_summary_call(self, call: Any) -> None:
            calls.append(call)

    pm = new_plugin_manager()
    pm.register(Log())
    seen: list[dict[str, Any]] = []

    def generate(prompt: list[dict[str, Any]], max_tokens: int,
                 sampling: dict[str, Any]) -> SummaryOutput:
        seen.append(sampling)
        if prompt[-1]["content"] == "boom":
            raise RuntimeError("the model ran out of memory")
        return SummaryOutput("the key is k2")

    local = LocalSummarizer(generate, trained=True, top_p=0.95, policy_version=5)
    with local.session() as session:
        out = session.summarize([{"role": "user", "content": "x"}], 8, CallInfo("summary", pm))
        with pytest.raises(SummarizerError, match="local summarizer failed: RuntimeError"):
            session.summarize([{"role": "user", "content": "boom"}], 8,
                              CallInfo("summary", pm))
    assert out.text == "the key is k2" and seen[0] == {"temperature": 1.0, "top_p": 0.95}
    assert [c.error for c in calls] == [None, "local summarizer failed: RuntimeError"]
    assert calls[0].trained and calls[0].policy_version == 5
    with pytest.raises(ConfigError, match="greedy"):
        LocalSummarizer(generate, trained=True, temperature=0)


def test_the_gpu_script_runs_dry_on_a_cpu() -> None:
    """benchmarks/rl_loop_gpu.py --dry-run, run as a user runs it: the same loop with the
    real Qwen tokenizer and a tiny random Qwen2 on a CPU (so it cannot rot without a GPU)."""
    import subprocess
    import sys
    from pathlib import Path

    from tests.rl.rowkit import QWEN_TOKENIZER

    if not QWEN_TOKENIZER.exists():
        pytest.skip(f"tokenizer absent: {QWEN_TOKENIZER}")
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.run([sys.executable, str(root / "benchmarks" / "rl_loop_gpu.py"),
                           "--dry-run", "--tokenizer", str(QWEN_TOKENIZER)], cwd=root,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = proc.stdout
    assert "device cpu; 1 iterations of 2 x 2 rollouts" in out and "tokens/s" in out
    assert "largest micro-batch 0 tokens" not in out  # the training step ran


def test_the_rl_command_is_listed_and_refuses_bad_seeds(
        capsys: pytest.CaptureFixture[str]) -> None:
    from agentcompact._cli import main

    assert main(["rl"]) == 2
    assert "choose a command: demo" in capsys.readouterr().err
    assert main(["rl", "demo", "--seeds", "a,b"]) == 2
    assert "--seeds takes integers" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["rl", "demo", "--help"])
    assert "--iterations" in capsys.readouterr().out


def test_the_rows_of_a_rollout_give_back_the_logprobs_it_was_sampled_with(
        setup: _Setup) -> None:
    """The rows' tokens, masks and logprobs line up with what was sampled: the policy's
    log-probabilities recomputed on the collated rows (turns and summaries) equal the
    rollout logprobs at every loss position, so the first PPO ratio is 1."""
    from agentcompact.rl.logprobs import chosen_logprobs
    from agentcompact.rl.ppo import collate_step

    episodes, _ = _rollouts(setup, trained=True, version=0, seed=5)
    rows = rows_from_events(episodes, setup.chat).rows
    assert any(r["summary_trained"] for r in rows)
    model = _model(setup, 5).eval()
    (batch,) = collate_step(rows, int(setup.hf.pad_token_id), len(rows))
    with torch.no_grad():
        hidden = model.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                             position_ids=batch["position_ids"]).last_hidden_state
        logp, rows_at, positions = chosen_logprobs(hidden, model.lm_head.weight, batch)
    assert logp.numel() == sum(int(r["response_mask"].sum()) for r in rows)
    old = batch["old_logprobs"][rows_at, positions]
    assert torch.allclose(logp, old, atol=1e-4)


def test_the_demo_loop_runs_end_to_end_with_every_arm(tmp_path: Any) -> None:
    """Small settings, every arm, one seed: warm start, rollouts through the engine, rows
    in memory, PPO steps; the curves, the compactions and the plot come out."""
    from agentcompact.rl.demo import DemoConfig, plot, run_demo

    config = DemoConfig(iterations=2, groups=2, samples=2, sft_episodes=8, sft_steps=4,
                        sft_copy_steps=2, seeds=(3,))
    lines: list[str] = []
    report = run_demo(config, progress=lines.append)
    assert [(c.arm, len(c.rewards)) for c in report.curves] == [
        ("trained", 2), ("frozen", 2), ("cliff", 2)]
    assert all(min(c.compactions) >= 2 for c in report.curves)  # the window, passed twice
    assert all(0.0 <= r <= 1.0 for c in report.curves for r in c.rewards)
    assert len(lines) == 1 + 3 * 2 and report.chance == 0.25
    assert set(report.warm_start_skills[3]) == {"read", "names_key", "right_key"}
    assert '"arm": "cliff"' in report.to_json()
    pytest.importorskip("matplotlib")
    assert plot(report, tmp_path / "curves.png") and (tmp_path / "curves.png").stat().st_size


def test_an_iterations_tasks_cover_the_keys_evenly() -> None:
    """A policy that always guesses one key scores chance on every iteration."""
    from collections import Counter

    from agentcompact.rl._carry_key import CarryKey

    task = CarryKey(keys=4)
    rng = random.Random(0)
    draws = [task.balanced_keys(rng, 8) for _ in range(20)]
    assert all(Counter(keys) == {k: 2 for k in task.key_words} for keys in draws)
    assert len({tuple(keys) for keys in draws}) > 1  # shuffled
    odd = task.balanced_keys(rng, 6)
    assert sorted(Counter(odd).values()) == [1, 1, 2, 2]
    spec = task.sample(rng, "k3")
    assert spec.key == "k3" and len(spec.fillers) == task.fillers


def test_the_warm_starts_rate_decays_over_its_second_phase_only() -> None:
    from agentcompact.rl.demo import _sft_rate

    assert [_sft_rate(2, 6, s) for s in range(7)] == [1.0, 1.0, 1.0, 0.75, 0.5, 0.25, 0.0]
    assert {_sft_rate(2, 0, s) for s in range(7)} == {1.0}  # sft_decay=False
