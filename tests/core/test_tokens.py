from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence

import pytest

from agentcompact import get_dialect, new_plugin_manager
from agentcompact._tokens import (
    IMAGE_TOKENS,
    MESSAGE_OVERHEAD,
    CharEstimateCounter,
    MessageMeter,
    TiktokenCounter,
    make_counter,
)
from agentcompact.errors import ConfigError

from ..conftest import QWEN_TOKENIZER
from .histories import build


class RecordingCounter:
    """A real counter (chars/4) that records what it was asked to count."""

    name = "recording"

    def __init__(self) -> None:
        self.texts: list[str] = []

    def count_texts(self, texts: Sequence[str]) -> list[int]:
        self.texts.extend(texts)
        return CharEstimateCounter().count_texts(texts)


def test_tiktoken_counts_real_tokens() -> None:
    counter = TiktokenCounter()
    assert counter.count_texts(["hello world", ""]) == [2, 0]
    assert counter.name == "tiktoken:o200k_base"
    assert TiktokenCounter("cl100k_base").count_texts(["hello world"]) == [2]


@pytest.mark.parametrize("encoding", ["o200k_base", "cl100k_base"])
def test_tiktoken_counts_are_encode_ordinary_lengths(encoding: str) -> None:
    import tiktoken

    texts = ["hello world", "<|endoftext|> is text here, <|endofprompt|> too",
             "a lone surrogate \ud800 in JSON", "日本語 and emoji 📋\U0001F600",
             "def f(x):\n    return x ** 2  # 3.14\n" * 300, " " * 7, "\n\n\r\n"]
    texts += [t[: k * 37] for t in texts[:4] for k in range(1, 4)]
    reference = tiktoken.get_encoding(encoding)
    counter = TiktokenCounter(encoding)
    assert [counter.count_texts([t])[0] for t in texts] == [
        len(reference.encode_ordinary(t)) for t in texts]
    assert counter.count_texts(texts) == [len(reference.encode_ordinary(t)) for t in texts]
    # over a million characters: counted by runs of texts in threads, in order
    many = [f"{i} {t}" if i % 5 else "" for i, t in enumerate(texts * 4)] + ["x, y " * 250_000]
    assert counter.count_texts(many) == [len(reference.encode_ordinary(t)) for t in many]


def test_chars_estimate() -> None:
    assert CharEstimateCounter().count_texts(["abcd", "abcde", ""]) == [1, 2, 0]


def test_growth_by_one_message_costs_one_message() -> None:
    counter = RecordingCounter()
    meter = MessageMeter(counter, get_dialect("openai_chat", new_plugin_manager()))
    history = build("openai_chat", [(10, [50], 0)] * 20)
    meter.measure(history[:-1])
    counter.texts.clear()
    meter.measure(history)
    assert len(counter.texts) == 1


def test_fresh_copies_hit_the_digest_cache() -> None:
    import json

    counter = RecordingCounter()
    meter = MessageMeter(counter, get_dialect("anthropic", new_plugin_manager()))
    history = build("anthropic", [(10, [50], 0)] * 5)
    first = meter.measure(history)
    counter.texts.clear()
    again = meter.measure(json.loads(json.dumps(history)))  # as a proxy parses each request
    assert counter.texts == [] and again.tokens == first.tokens


def test_message_size_includes_overhead_and_images() -> None:
    d = get_dialect("anthropic", new_plugin_manager())
    meter = MessageMeter(CharEstimateCounter(), d)
    m = {"role": "user", "content": [{"type": "text", "text": "abcdefgh"},
                                     {"type": "image", "source": {"type": "base64"}}]}
    assert meter.count(m) == 2 + MESSAGE_OVERHEAD + IMAGE_TOKENS


@pytest.mark.skipif(not QWEN_TOKENIZER.exists(), reason=f"absent: {QWEN_TOKENIZER}")
def test_hf_counter() -> None:
    pytest.importorskip("transformers", reason="needs the hf extra")
    counter = make_counter(f"hf:{QWEN_TOKENIZER}")
    assert counter.count_texts(["def f(x):\n    return x"])[0] > 3


def test_make_counter_errors() -> None:
    with pytest.raises(ConfigError, match="unknown counter 'bpe'"):
        make_counter("bpe")
    with pytest.raises(ConfigError, match="no count_texts"):
        make_counter(object())  # type: ignore[arg-type]  # deliberately wrong type


def test_offline_tiktoken_error_says_what_to_do(tmp_path: os.PathLike[str]) -> None:
    code = ("from agentcompact._tokens import TiktokenCounter\n"
            "try:\n    TiktokenCounter('cl100k_base')\n"
            "except Exception as e:\n    print(type(e).__name__, e)\n")
    env = {**os.environ, "TIKTOKEN_CACHE_DIR": str(tmp_path),
           "HTTPS_PROXY": "http://127.0.0.1:9", "HTTP_PROXY": "http://127.0.0.1:9"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, timeout=120).stdout
    assert "TokenizerError" in out and "TIKTOKEN_CACHE_DIR" in out
