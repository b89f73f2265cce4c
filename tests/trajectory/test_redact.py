"""The one redaction policy (agentcompact._redact): secret keys at any depth, counters kept."""

from __future__ import annotations

import orjson

from agentcompact._redact import REDACTED, is_secret_key, redact, redact_headers


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


def test_gateway_credential_headers_are_redacted() -> None:
    headers = {"cf-aig-authorization": "Bearer a", "Helicone-Auth": "Bearer b",
               "ocp-apim-subscription-key": "c", "x-api-token": "d", "x-auth-token": "e",
               "x-amz-security-token": "f", "x-signature": "g", "api-key": "h",
               "Cookie": "i", "x-request-id": "keep", "content-type": "keep",
               "anthropic-version": "keep", "x-claude-code-session-id": "keep"}
    out = redact_headers(headers)
    assert {k for k, v in out.items() if v == "keep"} == {
        "x-request-id", "content-type", "anthropic-version", "x-claude-code-session-id"}
    assert all(v == REDACTED for k, v in out.items() if headers[k] != "keep")
    pairs = [(b"helicone-auth", b"x"), (b"accept", b"y")]
    assert redact_headers(pairs) == {b"helicone-auth": REDACTED, b"accept": b"y"}
    assert headers["Helicone-Auth"] == "Bearer b"  # input not mutated


def test_ids_inside_a_json_string_are_redacted_and_the_session_kept() -> None:
    """Claude Code's ``metadata.user_id`` is a JSON string holding account and device ids
    (2.1.x: ``{"device_id", "account_uuid", "session_id"}``)."""
    user_id = orjson.dumps({"device_id": "d" * 64, "account_uuid": "acct-uuid",
                            "session_id": "sess-1", "parent_session_id": "sess-0"}).decode()
    body = {"metadata": {"user_id": user_id}, "max_tokens": 5,
            "messages": [{"role": "user", "content": '{"device_id": "in text stays"}'}]}
    out = redact(body)
    assert orjson.loads(out["metadata"]["user_id"]) == {
        "device_id": REDACTED, "account_uuid": REDACTED, "session_id": "sess-1",
        "parent_session_id": "sess-0"}
    assert out["messages"] == body["messages"]  # message text is never inspected
    legacy = "user_abc123_account_6f1c-uuid_session_9e2d-uuid"
    assert redact({"user_id": legacy}) == {
        "user_id": f"user_abc123_account_{REDACTED}_session_9e2d-uuid"}
    for plain in ("me", "{not json}", '{"session_id": "s"}'):
        assert redact({"user_id": plain}) == {"user_id": plain}
    # a thinking block's signature and a tool's token argument are not credentials
    block = {"type": "thinking", "thinking": "t", "signature": "sig"}
    assert redact(block) == block
    assert redact({"args": ["--token", "x"]}) == {"args": ["--token", "x"]}


def test_lists_of_scalars_are_copied_and_mixed_lists_still_walked() -> None:
    ids = list(range(1000)) + [0.5, "t", None, True]
    out = redact({"prompt_token_ids": ids})["prompt_token_ids"]
    assert out == ids and out is not ids  # a copy, as every list redact returns
    mixed = redact([1, {"api_key": "sk-1", "n": 2}, ("x-api-key", "sk-2"), "s"])
    assert mixed == [1, {"api_key": REDACTED, "n": 2}, ("x-api-key", REDACTED), "s"]
    pair = redact(["Authorization", "Bearer sk-3"])  # a header pair is a list of scalars
    assert pair == ["Authorization", REDACTED]


def test_key_kinds_are_the_same_for_repeated_keys_and_str_subclasses() -> None:
    class Text(str):
        pass

    legacy = "user_abc_account_1234_session_5678"
    for _ in range(2):  # the second round answers from the kinds already computed
        assert redact({"user_id": Text(legacy)})["user_id"] == f"user_abc_account_{REDACTED}" \
            "_session_5678"
        assert redact({"Client-Secret": "s", "prompt_tokens": 3}) == {
            "Client-Secret": REDACTED, "prompt_tokens": 3}
        assert is_secret_key("X_API_KEY") and not is_secret_key("max_tokens")
