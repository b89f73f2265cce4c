"""The proxy as an RL rollout gateway, end to end through real sockets: the official
``openai`` SDK (a harness that knows nothing of RL: only its base URL is set) → the
gateway → the upstream simulator answering as vLLM's OpenAI server does (token ids with
``return_token_ids``, per-token logprobs) with the Qwen tokenizer."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from agentcompact import Budget, new_plugin_manager
from agentcompact.integrations.proxy import GatewayConfig, ProxyConfig, ThreadedServer, create_app
from agentcompact.testing import UpstreamSim, logprob_of, serve
from tests.conftest import QWEN_TOKENIZER, needs_shared_data

pytest.importorskip("pyarrow")
pytest.importorskip("transformers")

pytestmark = [pytest.mark.network, needs_shared_data("tokenizers", "qwen2.5-coder-0.5b-instruct")]

MODEL = "sim-model"
TASK = "Fix the failing test in parser.py. " + "Context: " + "lorem ipsum dolor " * 20


@pytest.fixture
def vllm() -> Iterator[Any]:
    """The simulator as vLLM's OpenAI server with the policy's tokenizer."""
    sim = UpstreamSim(tokenizer=str(QWEN_TOKENIZER))
    with serve(sim.app) as server:
        server.sim = sim  # type: ignore[attr-defined]
        yield server


def _gateway(vllm: Any, tmp_path: Path, **options: Any) -> ThreadedServer:
    record = options.pop("record", None)
    config = ProxyConfig(openai_upstream=vllm.base_url, anthropic_upstream=vllm.base_url,
                         budget=Budget(options.pop("trigger", 700)), counter="chars",
                         store="memory:", log_requests=False, record=record)
    gateway = GatewayConfig(tokenizer=str(QWEN_TOKENIZER), **options)
    app = create_app(config, plugins=new_plugin_manager(), gateway=gateway)
    server = ThreadedServer(app).start()
    server.proxy = app.state.proxy  # type: ignore[attr-defined]
    return server


def _harness(base_url: str, turns: int, *, stream: bool = False) -> list[Any]:
    """An agent loop with the openai SDK: a task, then each answer and a long tool-ish
    observation, ``turns`` times. It sets nothing but its base URL."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are a coding agent."},
                                      {"role": "user", "content": TASK}]
    answers = []
    with openai.OpenAI(base_url=base_url, api_key="sk-test", max_retries=0) as client:
        for turn in range(turns):
            if stream:
                parts = client.chat.completions.create(model=MODEL, messages=messages,
                                                       max_tokens=64, stream=True)
                text = "".join(c.choices[0].delta.content or "" for c in parts if c.choices)
            else:
                reply = client.chat.completions.create(model=MODEL, messages=messages,
                                                       max_tokens=64)
                assert reply.choices[0].logprobs is not None  # asked for by the gateway
                text = reply.choices[0].message.content or ""
            answers.append(text)
            messages += [{"role": "assistant", "content": text},
                         {"role": "user", "content": f"observation {turn}: " + "x" * 600}]
    return answers


def _url(server: ThreadedServer, group: str, episode: str) -> str:
    return f"{server.base_url}/rl/g/{group}/e/{episode}/v1"


def _reward(server: ThreadedServer, episode: str, reward: float | None) -> httpx.Response:
    return httpx.post(f"{server.base_url}/rl/episodes/{episode}/reward",
                      json={"reward": reward}, timeout=30)


def test_a_harness_becomes_a_rollout_worker_with_its_base_url_only(
        vllm: Any, tmp_path: Path) -> None:
    server = _gateway(vllm, tmp_path, group_size=2, trigger_low=0.8, trigger_high=1.2, seed=4)
    try:
        _harness(_url(server, "task7", "run0"), turns=5)
        _harness(_url(server, "task7", "run1"), turns=3, stream=True)
        listed = httpx.get(f"{server.base_url}/rl/episodes", timeout=10).json()["episodes"]
        assert {(e["episode_id"], e["group_id"]) for e in listed} == {
            ("run0", "task7"), ("run1", "task7")}
        assert _reward(server, "run0", 1.0).json()["ready"] is False
        assert _reward(server, "run1", 0.0).json()["ready"] is True  # the group is complete
        rows = httpx.get(f"{server.base_url}/rl/rows", timeout=30).json()["rows"]
    finally:
        server.stop()

    sent = [r.body for r in vllm.sim.requests]
    # asked of the server for every call; the client asked for neither
    assert all(b["logprobs"] is True and b["return_token_ids"] is True for b in sent)
    by_episode: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        by_episode.setdefault(r["episode_id"], []).append(r)
    assert set(by_episode) == {"run0", "run1"}
    assert len(by_episode["run0"]) >= 2  # compacted: a new working context, a new row
    # the compaction was recorded in its place between the calls: it names the break
    assert by_episode["run0"][0]["compaction_trigger"] == "token_budget"
    # one GRPO group, advantages over the two episodes, broadcast to every segment
    assert {r["group_id"] for r in rows} == {"task7"}
    first = [a for a, m in zip(by_episode["run0"][0]["advantages"],
                               by_episode["run0"][0]["response_mask"], strict=True) if m]
    assert first and all(a == pytest.approx(0.7071, abs=1e-3) for a in first)
    # the server's own ids and logprobs, as it reported them: the first row's prompt is the
    # first call's prompt ids, its first sampled tokens score logprob_of(0), (1), ...
    prompts = [b for b in sent if b["messages"][1]["content"] == TASK]
    row = by_episode["run0"][0]
    sampled = [lp for lp, m in zip(row["rollout_logprobs"], row["response_mask"],
                                   strict=True) if m]
    assert sampled[:3] == pytest.approx([logprob_of(i) for i in range(3)], abs=1e-6)
    assert prompts and row["sampling"]["logprobs_mode"] == "raw"


def test_one_trigger_per_group(vllm: Any, tmp_path: Path) -> None:
    server = _gateway(vllm, tmp_path, trigger_low=0.5, trigger_high=1.5, seed=1)
    try:
        for group, episode in (("a", "a0"), ("a", "a1"), ("b", "b0")):
            _harness(_url(server, group, episode), turns=1)
        pool = server.proxy.engines  # type: ignore[attr-defined]
        triggers = {session: engine.budget.trigger_tokens
                    for (_, session), engine in pool._engines.items()}
    finally:
        server.stop()
    assert triggers["a0"] == triggers["a1"] != triggers["b0"]


def test_rows_equal_the_export_of_the_recorded_events_byte_for_byte(
        vllm: Any, tmp_path: Path) -> None:
    from agentcompact.trajectory.export import export_runs

    run = tmp_path / "run"
    server = _gateway(vllm, tmp_path, record=str(run), out=str(tmp_path / "rows"))
    try:
        for episode, turns in (("e0", 5), ("e1", 2)):
            _harness(_url(server, "g", episode), turns=turns)
        _harness(_url(server, "h", "f0"), turns=4, stream=True)
        for episode, reward in (("e0", 1.0), ("e1", 0.0), ("f0", 0.5)):
            assert _reward(server, episode, reward).status_code == 200
        flushed = httpx.post(f"{server.base_url}/rl/flush", timeout=60).json()
        assert flushed["groups"] == 2
    finally:
        server.stop()  # the recorder's file is complete once the proxy is closed
    export_runs([run], tmp_path / "export", str(QWEN_TOKENIZER))
    ours = tmp_path / "rows" / "batch-00000"
    for name in ("segments-00000.parquet", "episodes.parquet"):
        assert (ours / name).read_bytes() == (tmp_path / "export" / name).read_bytes(), name


def test_reward_endpoint_errors_are_one_line(vllm: Any, tmp_path: Path) -> None:
    server = _gateway(vllm, tmp_path)
    try:
        _harness(_url(server, "g", "e0"), turns=1)
        missing = _reward(server, "nope", 1.0)
        bad = httpx.post(f"{server.base_url}/rl/episodes/e0/reward", json={"score": 1},
                         timeout=10)
    finally:
        server.stop()
    assert missing.status_code == 404 and "not open" in missing.json()["error"]["message"]
    assert bad.status_code == 400
    message = bad.json()["error"]["message"]
    assert "\n" not in message and "reward" in message


def test_open_episodes_are_bounded_and_the_base_url_prefix_is_taken_off() -> None:
    from agentcompact.integrations.proxy import RLGateway

    gateway = RLGateway(GatewayConfig(tokenizer=str(QWEN_TOKENIZER), max_open=2), 1000,
                        new_plugin_manager())
    try:
        for episode in ("e1", "e2", "e3"):
            gateway.session({"x-agentcompact-episode": episode, "x-agentcompact-group": "g"},
                            "proxy-session")
        assert list(gateway._open) == ["e2", "e3"]  # the oldest dropped
        scope = gateway.route({"type": "http", "path": "/rl/g/task-1/e/r.2/v1/chat/completions",
                               "raw_path": b"/rl/g/task-1/e/r.2/v1/chat/completions",
                               "headers": [(b"x-agentcompact-episode", b"spoofed")]})
        assert scope["path"] == "/v1/chat/completions"
        assert scope["raw_path"] == b"/v1/chat/completions"
        assert dict(scope["headers"]) == {b"x-agentcompact-episode": b"r.2",
                                          b"x-agentcompact-group": b"task-1"}
        plain = {"type": "http", "path": "/v1/chat/completions"}
        assert gateway.route(plain) is plain
    finally:
        gateway.close()
