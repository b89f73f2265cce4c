"""The one redaction policy (agentcompact._redact): secret keys at any depth, counters kept."""

from __future__ import annotations

from agentcompact._redact import REDACTED, is_secret_key, redact


def test_secret_keys_are_redacted_at_any_depth_and_counters_are_not() -> None:
    for key in ("api_key", "X-Api-Key", "authorization", "Proxy-Authorization", "private_key",
                "credentials", "passwd", "password", "db_password", "client_secret",
                "OPENAI_API_KEY", "aws_secret_access_key", "access_token", "refresh_token",
                "account_id", "chatgpt-account-id", "cookie", "session_token"):
        assert is_secret_key(key), key
    for key in ("max_tokens", "prompt_tokens", "prompt_token_ids", "cached_tokens",
                "completion_tokens_details", "top_logprobs", "content", "tool_call_id",
                "token"):  # a logprob entry's token
        assert not is_secret_key(key), key
    value = {"messages": [{"role": "user", "content": "my password is hunter2"}],
             "client": {"nested": [{"api_key": "sk-1"}], "max_tokens": 3},
             "headers": [["Authorization", "Bearer x"], ["Accept", "json"]],
             "pair": ("x-api-key", "k")}
    out = redact(value)
    assert out["messages"] == value["messages"]  # values are never inspected
    assert out["client"] == {"nested": [{"api_key": REDACTED}], "max_tokens": 3}
    assert out["headers"] == [["Authorization", REDACTED], ["Accept", "json"]]
    assert out["pair"] == ("x-api-key", REDACTED)
    assert value["client"]["nested"][0]["api_key"] == "sk-1"  # input not mutated
