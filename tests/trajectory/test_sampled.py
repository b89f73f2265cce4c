"""Reading sampled-token fields from server bodies: the upstream simulator's OpenAI
logprobs (chat, streamed chat, responses) and vLLM's return_token_ids shape."""

from __future__ import annotations

import json

from agentcompact.testing._completion import Completion
from agentcompact.testing._openai_wire import ChatWire
from agentcompact.testing._responses_wire import ResponsesWire
from agentcompact.testing._script import split_tokens
from agentcompact.trajectory._sampled import (
    from_chat_chunks,
    from_chat_completion,
    from_responses,
)

TEXT = "The fix is in parser.py, line 12."


def _completion() -> Completion:
    return Completion(ordinal=1, model="m", text=TEXT, tool_calls=(), thinking=None,
                      input_tokens=10, output_tokens=9, truncated=False, created=0)


def test_openai_chat_logprobs_from_the_simulator_plain_and_streamed() -> None:
    body = {"logprobs": True, "top_logprobs": 2}
    plain = from_chat_completion(ChatWire().render(_completion(), body))
    assert plain.logprob_tokens == split_tokens(TEXT)
    assert plain.response_logprobs is not None and len(plain.response_logprobs) == len(
        split_tokens(TEXT)) and all(x < 0 for x in plain.response_logprobs)
    assert plain.response_token_ids is None and plain.prompt_token_ids is None
    chunks = [json.loads(json.dumps(f.data)) for f in ChatWire().frames(_completion(), body)
              if isinstance(f.data, dict)]
    streamed = from_chat_chunks(chunks)
    assert streamed.response_logprobs == plain.response_logprobs
    assert from_chat_completion(ChatWire().render(_completion(), {})).response_logprobs is None


def test_responses_logprobs_from_the_simulator() -> None:
    body = {"include": ["message.output_text.logprobs"], "top_logprobs": 0}
    got = from_responses(ResponsesWire().render(_completion(), body))
    assert got.logprob_tokens == split_tokens(TEXT)


def test_vllm_return_token_ids_shape() -> None:
    body = {"prompt_token_ids": [1, 2, 3],
            "choices": [{"index": 0, "token_ids": [7, 8],
                         "message": {"role": "assistant", "content": "hi"},
                         "logprobs": {"content": [{"token": "h", "logprob": -0.5},
                                                  {"token": "i", "logprob": -0.25}]}}]}
    got = from_chat_completion(body)
    assert got.model_call_fields() == {"prompt_token_ids": [1, 2, 3],
                                       "response_token_ids": [7, 8],
                                       "response_logprobs": [-0.5, -0.25]}
    chunks = [{"prompt_token_ids": [1, 2, 3], "choices": [{"delta": {}, "token_ids": []}]},
              {"choices": [{"delta": {"content": "h"}, "token_ids": [7]}]},
              {"choices": [{"delta": {"content": "i"}, "token_ids": [8]}]}]
    assert from_chat_chunks(chunks).response_token_ids == [7, 8]


def test_a_stream_of_several_choices_reads_choice_zero_only() -> None:
    """With ``n > 1`` a stream interleaves the choices; each chunk's ``choices[0]`` may be
    another choice's delta."""
    chunks = [
        {"prompt_token_ids": [1, 2], "choices": [{"index": 1, "token_ids": [90],
                                                  "logprobs": {"content": [
                                                      {"token": "x", "logprob": -9.0}]}}]},
        {"choices": [{"index": 0, "token_ids": [7],
                      "logprobs": {"content": [{"token": "a", "logprob": -0.5}]}}]},
        {"choices": [{"index": 1, "token_ids": [91]}, {"index": 0, "token_ids": [8]}]},
    ]
    got = from_chat_chunks(chunks)
    assert (got.prompt_token_ids, got.response_token_ids, got.response_logprobs) == (
        [1, 2], [7, 8], [-0.5])
