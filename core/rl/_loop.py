"""A closed RL loop with compaction in the rollouts: the live policy acts, writes its own
summaries when the engine compacts, episodes are recorded through the hooks, turned into
rows in memory, and trained with the project's loss — then again (torch, transformers).

The pieces a real loop swaps out: :class:`TorchPolicy` (sampling a causal LM token by token,
with the logprobs of what it sampled) for an inference engine; :func:`play` (one episode
through an ``Engine``, every call reported with its token ids, logprobs and policy
version) for the harness; :func:`train_on` (``collate_step`` + ``policy_loss_from_hidden``)
for the trainer. Rows come from :class:`agentcompact.trajectory.EpisodeCollector` and
:func:`agentcompact.trajectory.rows_from_events`: exactly the rows ``agentcompact export``
would write for the same events.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import torch

from agentcompact._events import EpisodeEnd, ModelCall
from agentcompact._summarizer import LocalSummarizer, SummaryOutput
from agentcompact.rl.ppo import OldLogprobs, collate_step, policy_loss_from_hidden
from agentcompact.rl.torch_data import move_to
from agentcompact.wire import SampledTokens

__all__ = ["Lockstep", "Step", "TorchPolicy", "end_episode", "play", "train_on"]


class TorchPolicy:
    """A causal LM sampling chat turns: prompt ids from the chat template, tokens sampled
    one by one (KV cache) at ``temperature``, each with its log-probability under the
    sampling distribution (``logprobs_mode: raw`` at temperature 1)."""

    def __init__(self, model: Any, hf: Any, *, temperature: float = 1.0,
                 generator: torch.Generator | None = None) -> None:
        self.model, self.hf = model, hf
        self.temperature = temperature
        self.eos = int(hf.convert_tokens_to_ids(hf.eos_token))
        self.pad = int(hf.pad_token_id)
        self.version = 0
        self.generator = generator
        self.sampled_tokens = 0
        self.sampling_s = 0.0
        self.lockstep: Lockstep | None = None

    def chat_ids(self, messages: Sequence[dict[str, Any]]) -> list[int]:
        text = self.hf.apply_chat_template(list(messages), tokenize=False,
                                           add_generation_prompt=True)
        return list(self.hf(text, add_special_tokens=False)["input_ids"])

    def text(self, ids: Sequence[int]) -> str:
        """The content of a sampled turn: its tokens joined by spaces, the stop token cut."""
        body = list(ids[:-1] if ids and ids[-1] == self.eos else ids)
        return " ".join(self.hf.convert_ids_to_tokens(body))

    def sample(self, prompt_ids: Sequence[int], max_new: int) -> tuple[list[int], list[float]]:
        """Sample up to ``max_new`` tokens (stopping after the stop token): ids, logprobs.
        Inside :meth:`Lockstep.run` the request joins the batch of the other episodes."""
        lockstep = self.lockstep
        if lockstep is not None and lockstep.serving():
            return lockstep.request(list(prompt_ids), max_new, self)
        return self.sample_batch([(list(prompt_ids), max_new)])[0]

    @torch.inference_mode()
    def sample_batch(self, requests: Sequence[tuple[list[int], int]]
                     ) -> list[tuple[list[int], list[float]]]:
        """Sample every request in one batch (right-padded, full forward per token: the
        turns are a few tokens long), rows in order; the generator is used in row order."""
        t0 = time.perf_counter()
        self.model.eval()
        seqs = [list(p) for p, _ in requests]
        limits = [m for _, m in requests]
        out: list[tuple[list[int], list[float]]] = [([], []) for _ in requests]
        live = [b for b in range(len(seqs)) if limits[b] > 0]
        while live:
            width = max(len(seqs[b]) for b in live)
            ids = torch.full((len(live), width), self.pad, dtype=torch.long)
            mask = torch.zeros((len(live), width), dtype=torch.long)
            for i, b in enumerate(live):
                ids[i, :len(seqs[b])] = torch.tensor(seqs[b])
                mask[i, :len(seqs[b])] = 1
            logits = self.model(input_ids=ids, attention_mask=mask, use_cache=False).logits
            last = torch.tensor([len(seqs[b]) - 1 for b in live])
            logp = torch.log_softmax(
                logits[torch.arange(len(live)), last].float() / self.temperature, -1)
            tokens = torch.multinomial(logp.exp(), 1, generator=self.generator).squeeze(1)
            still = []
            for i, b in enumerate(live):
                token = int(tokens[i])
                out[b][0].append(token)
                out[b][1].append(float(logp[i, token]))
                seqs[b].append(token)
                if token != self.eos and len(out[b][0]) < limits[b]:
                    still.append(b)
            live = still
        self.sampled_tokens += sum(len(ids) for ids, _ in out)
        self.sampling_s += time.perf_counter() - t0
        return out

    def summarizer(self, max_new: int, *, trained: bool) -> LocalSummarizer:
        """A summarizer that is this policy (``trained``: its summaries are trained)."""

        def generate(prompt: list[dict[str, Any]], max_tokens: int,
                     sampling: dict[str, Any]) -> SummaryOutput:
            prompt_ids = self.chat_ids(prompt)
            ids, logprobs = self.sample(prompt_ids, min(max_tokens, max_new))
            return SummaryOutput(self.text(ids), sampled=SampledTokens(
                prompt_token_ids=prompt_ids, response_token_ids=ids,
                response_logprobs=logprobs))

        return LocalSummarizer(generate, model="policy", context_window=self.context_window,
                               trained=trained, temperature=self.temperature,
                               policy_version=self.version)

    @property
    def context_window(self) -> int:
        return int(self.model.config.max_position_embeddings)


class Lockstep:
    """Episodes played concurrently (one thread each) whose sampling requests are served in
    batches: a batch is formed when every running episode waits on a request, and taken in
    the episodes' order, so the samples do not depend on thread timing (a fixed seed gives
    the same rollouts). What a rollout worker does against an inference engine."""

    def __init__(self, policy: TorchPolicy, *others: TorchPolicy) -> None:
        """``others``: further policies the episodes sample from (a frozen summarizer);
        each batch is served per policy, in the order of their first request."""
        self.policy = policy
        self.policies = (policy, *others)
        self._cv = threading.Condition()
        self._pending: dict[int, _Request] = {}
        self._running = 0
        self._local = threading.local()

    def serving(self) -> bool:
        return getattr(self._local, "index", None) is not None

    def request(self, prompt_ids: list[int], max_new: int, policy: TorchPolicy | None = None
                ) -> tuple[list[int], list[float]]:
        req = _Request(prompt_ids, max_new, policy or self.policy)
        with self._cv:
            self._pending[self._local.index] = req
            self._cv.notify_all()
            self._cv.wait_for(lambda: req.result is not None)
        assert req.result is not None
        return req.result

    def run(self, jobs: Sequence[Callable[[], T]]) -> list[T]:
        """Run each job in a thread of its own, serving their sampling in lockstep."""
        results: list[Any] = [None] * len(jobs)
        errors: list[BaseException] = []

        def worker(index: int, job: Callable[[], T]) -> None:
            self._local.index = index
            try:
                results[index] = job()
            except BaseException as exc:  # re-raised by run()
                errors.append(exc)
            finally:
                with self._cv:
                    self._running -= 1
                    self._cv.notify_all()

        for policy in self.policies:
            policy.lockstep = self
        self._running = len(jobs)
        threads = [threading.Thread(target=worker, args=(i, job), daemon=True)
                   for i, job in enumerate(jobs)]
        try:
            for thread in threads:
                thread.start()
            self._serve()
        finally:
            for thread in threads:
                thread.join()
            for policy in self.policies:
                policy.lockstep = None
        if errors:
            raise errors[0]
        return results

    def _serve(self) -> None:
        while True:
            with self._cv:
                self._cv.wait_for(lambda: self._running == 0
                                  or len(self._pending) == self._running)
                if self._running == 0:
                    return
                batch = sorted(self._pending.items())
                self._pending.clear()
            try:
                answers: list[tuple[list[int], list[float]]] = [([], []) for _ in batch]
                for policy in dict.fromkeys(r.policy for _, r in batch):
                    mine = [i for i, (_, r) in enumerate(batch) if r.policy is policy]
                    for i, answer in zip(mine, policy.sample_batch(
                            [(batch[i][1].prompt_ids, batch[i][1].max_new) for i in mine])):
                        answers[i] = answer
            except BaseException:
                answers = [([], []) for _ in batch]  # unblock the episodes, then raise
                raise
            finally:
                with self._cv:
                    for (_, req), answer in zip(batch, answers):
                        req.result = answer
                    self._cv.notify_all()


@dataclass
class _Request:
    prompt_ids: list[int]
    max_new: int
    policy: TorchPolicy
    result: tuple[list[int], list[float]] | None = None


T = TypeVar("T")


@dataclass(frozen=True)
class Step:
    """One turn of an episode's script: the messages the environment adds before the
    policy acts (the tool output of its previous action, a user message), and whether this
    turn ends the episode."""

    observations: tuple[dict[str, Any], ...]
    last: bool


#: ``(sent_messages, prompt_ids) -> (ids, logprobs)``: the policy acting on what it is sent
Act = Callable[[list[dict[str, Any]], list[int]], tuple[list[int], list[float]]]


def play(engine: Any, policy: TorchPolicy, head: list[dict[str, Any]],
         steps: Sequence[Step], *, episode_id: str, group_id: str,
         respond: Callable[[int, str, bool], dict[str, Any]], max_new: int,
         act: Act | None = None) -> str:
    """One episode through ``engine`` (every call compacted, then sampled by ``policy`` or
    ``act``, and reported on the engine's plugin manager with its token ids, logprobs and
    policy version). ``respond(turn, text, last)`` is the assistant message of a sampled
    text. Returns the last turn's text (the answer); the caller reports the episode's end.
    """
    engine.new_episode(episode_id)
    messages = list(head)
    text = ""
    for turn, step in enumerate(steps):
        messages.extend(step.observations)
        sent = engine.compact(messages).messages
        prompt_ids = policy.chat_ids(sent)
        ids, logprobs = (act or (lambda _, p: policy.sample(p, max_new)))(sent, prompt_ids)
        text = policy.text(ids)
        response = respond(turn, text, step.last)
        engine.pm.hook.agentcompact_log_model_call(call=ModelCall(
            episode_id=episode_id, dialect="openai_chat", messages=sent, response=[response],
            request={"temperature": policy.temperature, "logprobs_mode": "raw"},
            prompt_token_ids=prompt_ids, response_token_ids=ids, response_logprobs=logprobs,
            policy_version=policy.version, group_id=group_id))
        messages.append(response)
    return text


def end_episode(engine: Any, episode_id: str, group_id: str, sample_index: int,
                reward: float, metadata: dict[str, Any] | None = None) -> None:
    engine.pm.hook.agentcompact_log_episode_end(episode=EpisodeEnd(
        episode_id=episode_id, reward=reward, stop_reason="complete", group_id=group_id,
        sample_index=sample_index, metadata=dict(metadata or {})))


def train_on(model: Any, optimizer: torch.optim.Optimizer, rows: Sequence[dict[str, Any]],
             pad: int, *, micro_batch: int, epochs: int = 1,
             old_logprobs: OldLogprobs = "rollout",
             mode: str = "token-mean", device: str = "cpu") -> tuple[float, int]:
    """``epochs`` optimizer steps on ``rows`` with the project's loss (``collate_step``:
    micro-batches weighted by the step's global token count; ``policy_loss_from_hidden``:
    logits only at loss positions, a chunk at a time). Returns the last step's loss and the
    largest number of tokens in a micro-batch."""
    model.train()
    loss_value, peak = 0.0, 0
    for _ in range(epochs):
        optimizer.zero_grad()
        total = 0.0
        for batch in collate_step(list(rows), pad, micro_batch, mode=mode):
            batch = move_to(batch, device)
            peak = max(peak, int(batch["input_ids"].numel()))
            hidden = model.model(input_ids=batch["input_ids"],
                                 attention_mask=batch["attention_mask"],
                                 position_ids=batch["position_ids"]).last_hidden_state
            loss = policy_loss_from_hidden(hidden, model.lm_head.weight, batch,
                                           old_logprobs=old_logprobs,
                                           vocab_chunk=4096)
            loss.backward()  # type: ignore[no-untyped-call, unused-ignore]  # torch's own
            total += float(loss.detach())
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        loss_value = total
    return loss_value, peak
