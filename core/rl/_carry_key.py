"""The "carry the key" task of the closed-loop demo, its word-level tokenizer and its policy.

An episode (OpenAI chat messages, the policy's turns sampled)::

    system  "you are an agent"
    user    "read the logs then answer the question"
    assistant "read"            -> tool "key k2"          the key, in the first tool output
    assistant "read"            -> tool "log w7"          filler turns (x fillers)
    ...
    user    "question : which key ?"
    assistant "k2"              reward 1 if it names the key, else 0

The context window (the engine's trigger) is passed two or more times by the filler turns,
so the first tool output is compacted away long before the question: the answer can only
come from the summaries the policy wrote. With ``keys`` candidate keys, guessing scores
``1 / keys``.

The tokenizer is a ``tokenizers`` WordLevel model built on the fly from the texts an
episode can hold (the task's words, the chat template's, the compaction strategies' own
markers: gathered by running a scripted episode through the engine), with ChatML-style
special tokens and a chat template, wrapped as a ``transformers`` fast tokenizer. The policy
is a small randomly initialised ``Qwen2ForCausalLM``.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from agentcompact.errors import ConfigError

__all__ = [
    "CHAT_TEMPLATE",
    "SUMMARY_PROMPT",
    "CarryKey",
    "EpisodeSpec",
    "WordCounter",
    "build_tokenizer",
    "tiny_qwen2",
]

SPECIAL = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "[UNK]")
EOS = "<|im_end|>"
PAD = "<|endoftext|>"
#: ChatML without tool-call markup: the assistant's text is what it sampled (its tool call
#: is the environment's reading of it), so a rendered turn is exactly the sampled tokens
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
    "{% if m['content'] %}{{ m['content'] }}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
#: the summarizer's system prompt (the strategy's default is written for large models)
SUMMARY_PROMPT = "summarize the logs in {max_tokens} words"
SYSTEM = "you are an agent"
TASK = "read the logs then answer the question"
QUESTION = "question : which key ?"
ACTION = "read"


@dataclass(frozen=True)
class EpisodeSpec:
    """One task instance: the key and the filler words, in order."""

    key: str
    fillers: tuple[str, ...]

    @property
    def group_id(self) -> str:
        return f"{self.key}:{'-'.join(self.fillers)}"


@dataclass(frozen=True)
class CarryKey:
    """The task's sizes: ``keys`` candidate keys (chance = 1/keys), ``words`` filler words,
    ``fillers`` filler turns between the key and the question."""

    keys: int = 4
    words: int = 16
    fillers: int = 12

    def __post_init__(self) -> None:
        if self.keys < 2 or self.words < 1 or self.fillers < 1:
            raise ConfigError(f"carry-key needs keys >= 2, words >= 1, fillers >= 1, got "
                              f"{self.keys}, {self.words}, {self.fillers}")

    @property
    def key_words(self) -> list[str]:
        return [f"k{i}" for i in range(self.keys)]

    @property
    def filler_words(self) -> list[str]:
        return [f"w{i}" for i in range(self.words)]

    def sample(self, rng: random.Random, key: str | None = None) -> EpisodeSpec:
        """A task instance: ``key`` (default: one at random) and random filler words."""
        return EpisodeSpec(key if key is not None else rng.choice(self.key_words),
                           tuple(rng.choice(self.filler_words) for _ in range(self.fillers)))

    def balanced_keys(self, rng: random.Random, n: int) -> list[str]:
        """``n`` keys covering the candidates as evenly as possible, in random order: a
        batch of tasks over which a policy that always guesses one key scores chance (with
        keys drawn independently, it scores anywhere from 0 to 0.6 on 8 tasks)."""
        keys = [self.key_words[i % self.keys] for i in range(n)]
        if n % self.keys:
            tail = rng.sample(self.key_words, n % self.keys)
            keys[n - n % self.keys:] = tail
        rng.shuffle(keys)
        return keys

    def head(self) -> list[dict[str, Any]]:
        return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": TASK}]

    def observations(self, spec: EpisodeSpec) -> list[str]:
        """The tool output after each ``read``: the key first, then the fillers."""
        return [f"key {spec.key}", *(f"log {w}" for w in spec.fillers)]

    def reward(self, spec: EpisodeSpec, answer: str) -> float:
        words = answer.split()
        return 1.0 if words and words[0] == spec.key else 0.0


def tool_call(turn: int) -> dict[str, Any]:
    return {"id": f"call_{turn}", "type": "function",
            "function": {"name": ACTION, "arguments": "{}"}}


def scripted_messages(task: CarryKey, spec: EpisodeSpec) -> Iterator[list[dict[str, Any]]]:
    """The histories an episode sends when every turn is the ideal one (vocabulary)."""
    messages = task.head()
    for turn, observation in enumerate(task.observations(spec)):
        yield list(messages)
        messages += [{"role": "assistant", "content": ACTION, "tool_calls": [tool_call(turn)]},
                     {"role": "tool", "tool_call_id": f"call_{turn}", "content": observation}]
    yield [*messages, {"role": "user", "content": QUESTION}]


class WordCounter:
    """The engine's token counter: the demo tokenizer's own count."""

    at_most_utf8_bytes = True

    def __init__(self, hf: Any) -> None:
        self.hf = hf
        self.name = f"carry-key-wordlevel-{len(hf)}"

    def count_texts(self, texts: Sequence[str]) -> list[int]:
        return [len(ids) for ids in self.hf(list(texts), add_special_tokens=False)["input_ids"]]


def _pretokenize(texts: Sequence[str]) -> list[str]:
    from tokenizers.pre_tokenizers import Whitespace

    pre = Whitespace()
    words: list[str] = []
    for text in texts:
        for special in SPECIAL:
            text = text.replace(special, " ")
        words += [w for w, _ in pre.pre_tokenize_str(text)]
    return words


def build_tokenizer(task: CarryKey, corpus: Callable[[Any], list[str]] | None = None) -> Any:
    """A ``transformers`` fast tokenizer over the words the task's episodes hold.

    :param corpus: given a first tokenizer (the task's own words), the further texts an
        episode can hold — the demo passes the texts of a scripted episode run through
        each compaction strategy (headers, transcript markup, skim lines).
    """
    words = [*task.key_words, *task.filler_words,
             *_pretokenize([SYSTEM, TASK, QUESTION, ACTION, SUMMARY_PROMPT, "key log",
                            "system user assistant tool"])]
    hf = _wordlevel(words)
    if corpus is not None:
        hf = _wordlevel(words + _pretokenize(corpus(hf)))
    return hf


def _wordlevel(words: Sequence[str]) -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab: dict[str, int] = {t: i for i, t in enumerate(SPECIAL)}
    for word in words:
        vocab.setdefault(word, len(vocab))
    backend = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    backend.decoder = decoders.WordPiece(prefix="##", cleanup=False)  # words joined by spaces
    backend.add_special_tokens(list(SPECIAL))
    hf = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token=EOS,  # type: ignore[no-untyped-call]
                                 pad_token=PAD, unk_token="[UNK]")
    hf.chat_template = CHAT_TEMPLATE
    return hf


@dataclass(frozen=True)
class PolicySize:
    """The policy's dimensions (a Qwen2 architecture, randomly initialised)."""

    hidden: int = 64
    layers: int = 2
    heads: int = 4
    kv_heads: int = 2
    intermediate: int = 128
    max_positions: int = 512
    extra: dict[str, Any] = field(default_factory=dict)


def tiny_qwen2(vocab: int, size: PolicySize, seed: int) -> Any:
    """A randomly initialised ``Qwen2ForCausalLM`` (float32, SDPA attention)."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    config = Qwen2Config(  # type: ignore[call-arg]  # attn_implementation: a PretrainedConfig kwarg
        vocab_size=vocab, hidden_size=size.hidden, intermediate_size=size.intermediate,
        num_hidden_layers=size.layers, num_attention_heads=size.heads,
        num_key_value_heads=size.kv_heads, max_position_embeddings=size.max_positions,
        tie_word_embeddings=True, attn_implementation="sdpa", **size.extra)
    return Qwen2ForCausalLM(config)
