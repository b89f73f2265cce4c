"""A tiny policy for the trainers' rollout tests: a byte-level BPE tokenizer with Qwen2.5's
chat template (259 ids: the 256 bytes and three special tokens) and a random two-layer
Qwen2 over that vocabulary, small enough to sample and train on a shared CPU.

The tokenizer is a real fast tokenizer (``tokenizers``) saved to a folder, so everything
that loads a tokenizer by path (``ChatTokenizer``, SkyRL, verl, TRL) loads it as it would a
model's; the template is the one of the Qwen tokenizer in ``shared/data``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .rowkit import QWEN_TOKENIZER

SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")


def byte_tokenizer(folder: Path) -> Path:
    """Write the tokenizer to ``folder`` (once) and return it."""
    if (folder / "tokenizer.json").exists():
        return folder
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    bpe = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIALS])
    fast = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|im_end|>",
                                   pad_token="<|endoftext|>")
    fast.chat_template = (QWEN_TOKENIZER / "chat_template.jinja").read_text(encoding="utf-8")
    folder.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(str(folder))
    return folder


def vocab_size() -> int:
    return 256 + len(SPECIALS)


def tiny_lm(seed: int = 0, layers: int = 2) -> Any:
    import torch
    import transformers

    torch.manual_seed(seed)
    config = transformers.Qwen2Config(
        vocab_size=vocab_size(), hidden_size=32, intermediate_size=64,
        num_hidden_layers=layers, num_attention_heads=2, num_key_value_heads=1,
        max_position_embeddings=4096, tie_word_embeddings=True, attn_implementation="eager")
    return transformers.Qwen2ForCausalLM(config)


def prompts_dataset(prompts: list[str]) -> Any:
    """A ``datasets.Dataset`` of prompts (TRL's train dataset), its fingerprint given:
    datasets would otherwise fingerprint it by pickling it with dill, which fails on pyarrow
    26 (its MonthDayNano class is named ``builtins.MonthDayNano``)."""
    import datasets
    from datasets.table import InMemoryTable

    return datasets.Dataset(InMemoryTable.from_pydict({"prompt": prompts}),
                            fingerprint=f"prompts-{len(prompts)}-{hash(tuple(prompts))}")


def eos_ids(tok: Any) -> Sequence[int]:
    return [int(tok.convert_tokens_to_ids("<|im_end|>"))]


class CountingEnv:
    """A tool-loop environment: each response gets a fixed observation (a tool result of
    ``obs_chars`` characters) until ``turns`` responses; the reward is the share of ASCII
    characters in the responses (a reward the policy can move, different between rollouts)."""

    def __init__(self, turns: int = 4, obs_chars: int = 60) -> None:
        self.turns, self.obs_chars, self.seen = turns, obs_chars, 0
        self.a = self.chars = 0

    async def step(self, text: str, sample: Any) -> Any:
        from agentcompact.rl.rollout import Step

        self.seen += 1
        self.a += sum(c.isascii() for c in text)
        self.chars += len(text)
        if self.seen >= self.turns:
            return Step(done=True, reward=self.a / max(self.chars, 1))
        result = (f"result {self.seen}: " + "x" * self.obs_chars)[: self.obs_chars]
        return Step(observations=[{"role": "user", "content": result}])
