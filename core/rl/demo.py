"""The closed-loop CompactionRL demo: a policy that learns to carry a fact through its own
summaries, from rollout to update, on a CPU (``agentcompact rl demo``; torch, transformers).

Each iteration: ``groups`` task instances of "carry the key" (:mod:`._carry_key`), each
played ``samples`` times by the live policy through an :class:`~agentcompact.Engine` whose
summary strategy's summarizer is the policy itself (:class:`~agentcompact.LocalSummarizer`
over the model in memory); every call is reported through the hooks to an
:class:`~agentcompact.trajectory.EpisodeCollector`; the finished episodes become rows with
GRPO advantages over each group (:func:`~agentcompact.trajectory.rows_from_events`: the
rows ``agentcompact export`` would write), and the policy takes one PPO step with the
project's loss (``collate_step`` + ``policy_loss_from_hidden``). Arms, from the same
warm-started weights:

* ``trained`` — the policy's summaries are trained (each its own row, SUPO-style);
* ``frozen`` — the summaries are written by the warm-started weights, kept aside: not
  trained (mask 0, ReSum-style) and not moved by the training of the other turns either
  (the weights are shared, and training the answers alone drifts the summaries): the
  control;
* ``cliff`` — the cliff strategy (verbatim only, no summary).

Warm start (:func:`_warm_start`): a short SFT on demonstrations played through the same
engine by a scripted teacher who acts, answers the key the context shows (else guesses one)
and writes one-word summaries: first always the key, which teaches reading a key from a
summary and copying it from a transcript; then the key with probability ``prior_key``, else
an observed filler word. So the warm-started policy can carry the key but rarely does;
learning to carry it is left to RL. The tasks of an iteration cover the keys evenly
(:meth:`~._carry_key.CarryKey.balanced_keys`), so a policy that always guesses one key
scores chance on every iteration, not anywhere from 0 to 0.6 by the luck of the draw.
The warm start's skills are measured before RL (:func:`_skills`).
"""

from __future__ import annotations

import copy
import functools
import random
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentcompact.errors import ConfigError

__all__ = ["ARMS", "ArmCurve", "DemoConfig", "DemoReport", "plot", "run_demo"]

ARMS = ("trained", "frozen", "cliff")
_WORD = re.compile(r"\b[kw]\d+\b")
_KEY = re.compile(r"\bk\d+\b")


@dataclass(frozen=True)
class DemoConfig:
    """Sizes of the demo (defaults: the documented run, a few minutes on 2 cores)."""

    keys: int = 4
    words: int = 16
    fillers: int = 8
    trigger_tokens: int = 80
    target_tokens: int = 56
    iterations: int = 20
    groups: int = 8
    samples: int = 8
    lr: float = 1e-3
    ppo_epochs: int = 2
    #: seq-mean-token-mean: every segment row weighs alike, so a summary (a row of a few
    #: tokens) is not drowned by the long rows of "read" turns (token-mean would)
    loss_mode: str = "seq-mean-token-mean"
    micro_batch: int = 64
    sft_episodes: int = 128
    sft_steps: int = 450
    #: the first steps teach reading and copying the key (see :func:`_warm_start`)
    sft_copy_steps: int = 250
    sft_lr: float = 1e-3
    #: phase 2's learning rate decays linearly from ``sft_lr`` to 0, so the summaries'
    #: prior settles rather than following the last few batches (at a constant rate and
    #: ``prior_key`` 0.05 it landed anywhere in 0.008-0.058 by seed; decayed, with
    #: ``prior_key`` 0.06, in 0.04-0.07 on seeds 0-2)
    sft_decay: bool = True
    sft_batch: int = 32
    #: the warm start's summaries name the key with this probability (else an observed
    #: filler word): the exploration RL starts from, and about what the control keeps
    #: (chance + (1 - chance) x this, about 0.3 with 4 keys)
    prior_key: float = 0.06
    hidden: int = 64
    layers: int = 2
    seeds: tuple[int, ...] = (0,)
    arms: tuple[str, ...] = ARMS
    max_new: int = 4
    threads: int | None = 1

    def __post_init__(self) -> None:
        unknown = set(self.arms) - set(ARMS)
        if unknown or not self.arms:
            raise ConfigError(f"arms {sorted(unknown) or '()'}: choose from {ARMS}")
        if min(self.iterations, self.groups, self.samples, self.micro_batch) < 1:
            raise ConfigError("iterations, groups, samples and micro_batch must be >= 1")
        if self.samples < 2:
            raise ConfigError("samples must be >= 2: GRPO compares the samples of a task")


@dataclass
class ArmCurve:
    """One arm on one seed: the mean reward of each iteration's rollouts."""

    arm: str
    seed: int
    rewards: list[float] = field(default_factory=list)
    compactions: list[float] = field(default_factory=list)
    summaries_with_key: list[float] = field(default_factory=list)
    wall_s: float = 0.0
    sampled_tokens: int = 0
    peak_batch_tokens: int = 0

    @property
    def final(self) -> float:
        """The mean over the last quarter of the iterations (at least one)."""
        tail = self.rewards[-max(1, len(self.rewards) // 4):]
        return sum(tail) / len(tail)


@dataclass
class DemoReport:
    config: DemoConfig
    chance: float
    curves: list[ArmCurve]
    warm_start_s: dict[int, float]
    wall_s: float
    #: per seed, the warm start's skills before RL (:func:`_skills`)
    warm_start_skills: dict[int, dict[str, float]] = field(default_factory=dict)

    def finals(self, arm: str) -> list[float]:
        return [c.final for c in self.curves if c.arm == arm]

    def to_json(self) -> str:
        import dataclasses
        import json

        return json.dumps({"config": dataclasses.asdict(self.config), "chance": self.chance,
                           "wall_s": self.wall_s, "warm_start_s": self.warm_start_s,
                           "warm_start_skills": self.warm_start_skills,
                           "curves": [dataclasses.asdict(c) for c in self.curves]}, indent=1)


# --------------------------------------------------------------------------- the setup


class _Setup:
    """The task, tokenizer and engines' settings of one run."""

    def __init__(self, config: DemoConfig, hf: Any = None, name: str | None = None) -> None:
        """``hf``: a real model's tokenizer (its chat template renders tool calls its own
        way, so the tool outputs are then user messages); default: the word-level one."""
        from agentcompact.trajectory._tokenize import ChatTokenizer

        from ._carry_key import CarryKey, build_tokenizer

        self.config = config
        self.task = CarryKey(keys=config.keys, words=config.words, fillers=config.fillers)
        self.tool_calls = hf is None
        self.hf = build_tokenizer(self.task, self._corpus) if hf is None else hf
        self.chat = ChatTokenizer(self.hf, name or "carry-key-wordlevel")

    def steps(self, spec: Any) -> list[Any]:
        return _steps(self.task, spec, tool_calls=self.tool_calls)

    def respond(self, turn: int, text: str, last: bool) -> dict[str, Any]:
        return _respond(turn, text, last or not self.tool_calls)

    def engine(self, strategy: Any, pm: Any, counter_hf: Any | None = None) -> Any:
        from agentcompact import Budget, Engine

        from ._carry_key import WordCounter

        return Engine(strategy=strategy, dialect="openai_chat", plugins=pm,
                      budget=Budget(trigger_tokens=self.config.trigger_tokens,
                                    target_tokens=self.config.target_tokens, recent_turns=1),
                      counter=WordCounter(counter_hf if counter_hf is not None else self.hf))

    def summary_strategy(self, summarizer: Any) -> Any:
        from agentcompact.strategies import SummaryStrategy

        from ._carry_key import SUMMARY_PROMPT

        # no cache: every summary is the policy's sample in its own episode (a frozen
        # summarizer would otherwise reuse one summary for all the samples of a task)
        return SummaryStrategy(summarizer, prompt=SUMMARY_PROMPT, min_output_tokens=1,
                               cache_size=0)

    def _corpus(self, hf: Any) -> list[str]:
        """Texts of a scripted episode through each strategy (the vocabulary's rest)."""
        from agentcompact import LocalSummarizer, SummaryOutput, new_plugin_manager

        from ._carry_key import scripted_messages

        texts: list[str] = []

        def echo(prompt: list[dict[str, Any]], _: int, __: dict[str, Any]) -> SummaryOutput:
            texts.extend(str(m["content"]) for m in prompt)
            return SummaryOutput("w0")

        spec = self.task.sample(random.Random(0))
        for strategy in (self.summary_strategy(LocalSummarizer(echo)), "cliff"):
            engine = self.engine(strategy, new_plugin_manager(), hf)
            for messages in scripted_messages(self.task, spec):
                for m in engine.compact(messages).messages:
                    texts.append(str(m.get("content") or ""))
                    texts.append(str(m["role"]))
        texts.append(hf.apply_chat_template([{"role": "user", "content": "x"}], tokenize=False))
        return texts


def _steps(task: Any, spec: Any, *, tool_calls: bool = True) -> list[Any]:
    from ._carry_key import QUESTION
    from ._loop import Step

    observations = task.observations(spec)
    steps = [Step((), False)]
    for turn, text in enumerate(observations):
        tool = ({"role": "tool", "tool_call_id": f"call_{turn}", "content": text} if tool_calls
                else {"role": "user", "content": f"tool output : {text}"})
        last = turn == len(observations) - 1
        steps.append(Step((tool, {"role": "user", "content": QUESTION}) if last else (tool,),
                          last))
    return steps


def _respond(turn: int, text: str, last: bool) -> dict[str, Any]:
    from ._carry_key import tool_call

    message: dict[str, Any] = {"role": "assistant", "content": text}
    if not last:
        message["tool_calls"] = [tool_call(turn)]
    return message


# --------------------------------------------------------------------------- warm start


class _Teacher:
    """Scripted demonstrations: act, answer the key the context shows (else guess), and
    summarize in one word: the key with probability ``show_key``, else an observed filler
    word at random."""

    def __init__(self, setup: _Setup, rng: random.Random, show_key: float = 0.0) -> None:
        self.setup, self.rng, self.show_key = setup, rng, show_key

    def ids(self, text: str) -> tuple[list[int], list[float]]:
        hf = self.setup.hf
        ids = [*hf(text, add_special_tokens=False)["input_ids"],
               hf.convert_tokens_to_ids(hf.eos_token)]
        return ids, [0.0] * len(ids)

    def act(self, sent: list[dict[str, Any]], _: list[int]) -> tuple[list[int], list[float]]:
        from ._carry_key import ACTION, QUESTION

        if sent[-1].get("content") != QUESTION:
            return self.ids(ACTION)
        seen = _KEY.findall(" ".join(str(m.get("content") or "") for m in sent[:-1]))
        return self.ids(seen[-1] if seen else self.rng.choice(self.setup.task.key_words))

    def summarize(self, prompt: list[dict[str, Any]], _: int, __: dict[str, Any]) -> Any:
        from agentcompact import SummaryOutput
        from agentcompact.trajectory import SampledTokens

        transcript = str(prompt[-1]["content"])
        keys = _KEY.findall(transcript)
        fillers = [w for w in _WORD.findall(transcript) if w not in keys]
        if keys and (self.rng.random() < self.show_key or not fillers):
            text = keys[0]
        else:
            text = self.rng.choice(fillers or self.setup.task.filler_words)
        ids, logprobs = self.ids(text)
        prompt_ids = self.setup.hf.apply_chat_template(prompt, tokenize=False,
                                                       add_generation_prompt=True)
        return SummaryOutput(text, sampled=SampledTokens(
            prompt_token_ids=self.setup.hf(prompt_ids, add_special_tokens=False)["input_ids"],
            response_token_ids=ids, response_logprobs=logprobs))


def _demonstrations(setup: _Setup, teacher: _Teacher, episodes: int, prefix: str
                    ) -> list[dict[str, Any]]:
    """Rows of ``episodes`` teacher episodes (advantage 1 on every sampled token)."""
    import numpy as np

    from agentcompact import LocalSummarizer, new_plugin_manager
    from agentcompact.trajectory import EpisodeCollector, rows_from_events
    from agentcompact.trajectory.export import ExportOptions

    from ._loop import TorchPolicy, end_episode, play

    pm = new_plugin_manager()
    collector = EpisodeCollector()
    pm.register(collector)
    engine = setup.engine(setup.summary_strategy(
        LocalSummarizer(teacher.summarize, trained=True)), pm)
    policy = TorchPolicy(None, setup.hf)
    for n in range(episodes):
        spec, eid = setup.task.sample(teacher.rng), f"{prefix}-{n}"
        play(engine, policy, setup.task.head(), setup.steps(spec), episode_id=eid,
             group_id=eid, respond=setup.respond, max_new=setup.config.max_new,
             act=teacher.act)
        end_episode(engine, eid, eid, 0, 1.0)
    rows = rows_from_events(collector.finished(), setup.chat,
                            ExportOptions(advantage="none")).rows
    out: list[dict[str, Any]] = rows
    for row in out:
        row["advantages"] = np.asarray(row["response_mask"], dtype=np.float32)
    return out


def _warm_start(setup: _Setup, model: Any, seed: int) -> dict[str, float]:
    """SFT on teacher demonstrations, with the project's loss at A = 1 (``old_logprobs``
    detached: the gradient of log π on every sampled token, token-mean), in two phases:

    1. ``sft_copy_steps`` steps on episodes whose one-word summaries always name the key:
       their answers (reading the key a summary shows) and their summaries (copying the key
       from the transcript), a quarter and three quarters of each batch;
    2. the remaining steps draw alike from answers (those, and the answers of episodes
       whose summaries name the key with probability ``prior_key``, else an observed filler
       word: a key guessed at random when no key is in context), from those episodes'
       summaries, and from their other turns: the summaries now name *a* word of the
       transcript, the key about ``prior_key`` of the time, and the right key when they
       name one. The learning rate decays to 0 over phase 2 (``sft_decay``).

    So the warm-started policy reads a key from a summary, guesses one otherwise, and can
    copy the key into a summary but rarely chooses to: carrying it is left to RL. Returns
    the skills measured on held-out demonstrations (:func:`_skills`)."""
    import torch

    config = setup.config
    rng = random.Random(seed + 10_000)
    shown = _demonstrations(setup, _Teacher(setup, rng, show_key=1.0),
                            config.sft_episodes, "sft-shown")
    prior = _demonstrations(setup, _Teacher(setup, rng, show_key=config.prior_key),
                            config.sft_episodes, "sft")
    held_out = _demonstrations(setup, _Teacher(setup, rng, show_key=1.0), 32, "held-out")
    answers = [r for r in shown if r["is_last_segment"]]
    copies = [r for r in shown if r["summary_trained"]]
    summaries = [r for r in prior if r["summary_trained"]]
    # the answers of phase 2: the key a summary shows, else a key guessed at random
    either = [*answers, *(r for r in prior if r["is_last_segment"])]
    turns = [r for r in prior if not r["summary_trained"] and not r["is_last_segment"]]
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.sft_lr)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, functools.partial(
        _sft_rate, config.sft_copy_steps, config.sft_steps if config.sft_decay else 0))
    from ._loop import train_on

    pad = int(setup.hf.pad_token_id)
    shuffle = random.Random(seed)

    def draw(rows: list[dict[str, Any]], n: int) -> list[dict[str, Any]]:
        return shuffle.sample(rows, min(len(rows), n)) if rows else []

    batch_size = config.sft_batch
    for step in range(config.sft_steps):
        if step < config.sft_copy_steps:
            batch = [*draw(answers, batch_size // 4), *draw(copies, batch_size - batch_size // 4)]
        else:
            third = max(1, batch_size // 3)
            batch = [*draw(either, third), *draw(summaries, third), *draw(turns, third)]
        if batch:
            train_on(model, optimizer, batch, pad, micro_batch=config.micro_batch,
                     old_logprobs="detached")
        schedule.step()
    return _skills(setup, model, held_out)


def _sft_rate(copy_steps: int, steps: int, step: int) -> float:
    """The warm start's learning-rate factor: 1 in phase 1; in phase 2 (when ``steps``),
    linear from 1 down to 0 at step ``steps``."""
    if step < copy_steps or steps <= copy_steps:
        return 1.0
    return max(0.0, (steps - step) / (steps - copy_steps))


def _skills(setup: _Setup, model: Any, rows: Sequence[dict[str, Any]]) -> dict[str, float]:
    """Teacher-forced skills on demonstrations whose summaries name the key:

    * ``read``: the answer's most likely first token is the key a summary shows;
    * ``names_key``: the probability mass of the summary's first token on the keys
      (whichever): how often the policy chooses to name a key;
    * ``right_key``: of that mass, the share on the right key (the copy's accuracy).
    """
    import torch

    from agentcompact.rl.ppo import collate_step

    answers = [r for r in rows if r["is_last_segment"]]
    copies = [r for r in rows if r["summary_trained"]]
    keys = [int(setup.hf.convert_tokens_to_ids(k)) for k in setup.task.key_words]
    pad = int(setup.hf.pad_token_id)
    model.eval()

    def first_token_probs(part: Sequence[dict[str, Any]]) -> torch.Tensor:
        out = []
        for batch in collate_step(list(part), pad, 64):
            with torch.no_grad():
                hidden = model.model(input_ids=batch["input_ids"],
                                     attention_mask=batch["attention_mask"],
                                     position_ids=batch["position_ids"]).last_hidden_state
                at = hidden[torch.arange(len(hidden)), batch["response_start"] - 1]
                out.append(torch.softmax(model.lm_head(at).float(), -1))
        return torch.cat(out)

    skills = {"read": 0.0, "names_key": 0.0, "right_key": 0.0}
    if answers:
        probs = first_token_probs(answers)
        target = torch.tensor([int(r["response_ids"][0]) for r in answers])
        skills["read"] = float((probs.argmax(-1) == target).float().mean())
    if copies:
        probs = first_token_probs(copies)
        target = torch.tensor([int(r["response_ids"][0]) for r in copies])
        on_keys = probs[:, keys].sum(-1)
        skills["names_key"] = float(on_keys.mean())
        right = probs[torch.arange(len(copies)), target]
        skills["right_key"] = float(right.sum() / on_keys.sum().clamp_min(1e-9))
    return skills


# --------------------------------------------------------------------------- RL arms


def _run_arm(setup: _Setup, arm: str, model: Any, seed: int,
             progress: Callable[[str], None], *, policy_cls: Any = None,
             device: str = "cpu") -> ArmCurve:
    """Train ``model`` with one arm's compaction for ``config.iterations`` iterations."""
    import torch

    from agentcompact import new_plugin_manager
    from agentcompact.trajectory import EpisodeCollector, rows_from_events
    from agentcompact.trajectory.export import ExportOptions

    from ._loop import Lockstep, TorchPolicy, train_on

    config = setup.config
    generator = torch.Generator(device).manual_seed(seed * 1000 + ARMS.index(arm))
    policy = (policy_cls or TorchPolicy)(model, setup.hf, generator=generator)
    pm = new_plugin_manager()
    collector = EpisodeCollector()
    pm.register(collector)
    # frozen: the summaries are written by the warm-started weights, kept aside: neither
    # trained as rows nor moved by the training of the other turns (the weights are shared)
    writer = policy if arm != "frozen" else (policy_cls or TorchPolicy)(
        copy.deepcopy(model).eval(), setup.hf,
        generator=torch.Generator(device).manual_seed(seed * 1000 + 99))
    summarizer = writer.summarizer(config.max_new, trained=arm == "trained")
    strategy = "cliff" if arm == "cliff" else setup.summary_strategy(summarizer)
    slots = config.groups * config.samples
    engines = [setup.engine(strategy, pm) for _ in range(slots)]  # one per running episode
    lockstep = Lockstep(policy, *([writer] if writer is not policy else []))
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr)
    rng = random.Random(seed)  # the same tasks for every arm of a seed
    curve = ArmCurve(arm, seed)
    t0 = time.perf_counter()
    for it in range(config.iterations):
        jobs: list[Callable[[], float]] = []
        order: dict[str, int] = {}
        # the keys of an iteration's tasks cover the candidates evenly: guessing scores chance
        for g, key in enumerate(setup.task.balanced_keys(rng, config.groups)):
            spec, gid = setup.task.sample(rng, key), f"it{it}-g{g}"
            for s in range(config.samples):
                eid = f"{gid}-s{s}"
                order[eid] = len(jobs)
                jobs.append(functools.partial(_episode, setup, engines[len(jobs)], policy,
                                              spec, gid, eid, s))
        rewards = lockstep.run(jobs)
        episodes = sorted(collector.finished(), key=lambda e: order[e.episode_id])
        curve.rewards.append(sum(rewards) / len(rewards))
        curve.compactions.append(_mean_compactions(episodes))
        curve.summaries_with_key.append(_summaries_with_key(episodes))
        rows = rows_from_events(episodes, setup.chat, ExportOptions()).rows
        rows = [r for r in rows if not r["mask_episode"] and bool(r["advantages"].any())]
        if rows:
            _, peak = train_on(model, optimizer, rows, policy.pad,
                               micro_batch=config.micro_batch, epochs=config.ppo_epochs,
                               mode=config.loss_mode, device=device)
            curve.peak_batch_tokens = max(curve.peak_batch_tokens, peak)
        policy.version += 1
        if writer is policy:
            summarizer.policy_version = policy.version
        progress(f"seed {seed} {arm:8s} iteration {it + 1:3d}/{config.iterations}: reward "
                 f"{curve.rewards[-1]:.2f}, compactions/episode {curve.compactions[-1]:.1f}, "
                 f"key in last summary {curve.summaries_with_key[-1]:.2f}")
    curve.wall_s = time.perf_counter() - t0
    curve.sampled_tokens = policy.sampled_tokens + (
        writer.sampled_tokens if writer is not policy else 0)
    return curve


def _episode(setup: _Setup, engine: Any, policy: Any, spec: Any, gid: str, eid: str,
             sample: int) -> float:
    from ._loop import end_episode, play

    answer = play(engine, policy, setup.task.head(), setup.steps(spec), episode_id=eid,
                  group_id=gid, respond=setup.respond, max_new=setup.config.max_new)
    reward = setup.task.reward(spec, answer)
    end_episode(engine, eid, gid, sample, reward, {"key": spec.key})
    return reward


def _mean_compactions(episodes: Sequence[Any]) -> float:
    return sum(sum(1 for k, _ in e.items if k == "compaction") for e in episodes) / max(
        1, len(episodes))


def _summaries_with_key(episodes: Sequence[Any]) -> float:
    """Share of episodes whose last summary names their key (0 for cliff)."""
    hits = 0
    for e in episodes:
        outputs = [v.output for k, v in e.items if k == "summary_call" and not v.error]
        key = (e.end.metadata or {}).get("key") if e.end is not None else None
        if outputs and key is not None and key in outputs[-1].split():
            hits += 1
    return hits / max(1, len(episodes))


def _model(setup: _Setup, seed: int) -> Any:
    from ._carry_key import PolicySize, tiny_qwen2

    return tiny_qwen2(len(setup.hf), PolicySize(hidden=setup.config.hidden,
                                                layers=setup.config.layers), seed)


def run_demo(config: DemoConfig | None = None,
             progress: Callable[[str], None] = print) -> DemoReport:
    """Warm-start a tiny policy per seed, then train each arm from it; the curves."""
    import torch

    config = config or DemoConfig()
    if config.threads is not None:
        torch.set_num_threads(config.threads)
    t0 = time.perf_counter()
    setup = _Setup(config)
    curves: list[ArmCurve] = []
    warm: dict[int, float] = {}
    skills: dict[int, dict[str, float]] = {}
    for seed in config.seeds:
        t1 = time.perf_counter()
        model = _model(setup, seed)
        skills[seed] = _warm_start(setup, model, seed)
        warm[seed] = time.perf_counter() - t1
        sk = skills[seed]
        progress(f"seed {seed}: warm start {warm[seed]:.1f} s "
                 f"({config.sft_steps} SFT steps): reads the key a summary shows "
                 f"{sk['read']:.2f}, summaries name a key {sk['names_key']:.2f}, "
                 f"the right one {sk['right_key']:.2f} of those")
        weights = copy.deepcopy(model.state_dict())
        for arm in config.arms:
            model = _model(setup, seed)
            model.load_state_dict(weights)
            curves.append(_run_arm(setup, arm, model, seed, progress))
    return DemoReport(config, 1.0 / config.keys, curves, warm, time.perf_counter() - t0,
                      skills)


def plot(report: DemoReport, path: str | Path) -> bool:
    """Save the reward curves as a PNG (needs matplotlib, the ``plot`` extra); ``False``
    when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    colors = {"trained": "tab:blue", "frozen": "tab:orange", "cliff": "tab:green"}
    fig, ax = plt.subplots(figsize=(7, 4))
    for curve in report.curves:
        ax.plot(range(1, len(curve.rewards) + 1), curve.rewards, color=colors[curve.arm],
                alpha=0.8, label=f"{curve.arm} (seed {curve.seed})")
    ax.axhline(report.chance, color="gray", linestyle="--", label=f"chance 1/{report.config.keys}")
    ax.set_xlabel("iteration")
    ax.set_ylabel("mean reward of the rollouts")
    ax.set_ylim(0, 1.02)
    ax.set_title("carry the key: summaries trained vs not, and cliff")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(str(path), dpi=100)
    plt.close(fig)
    return True

