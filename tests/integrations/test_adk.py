"""Google ADK's real ``LlmAgent`` and ``Runner`` with :class:`CompactionCallback` as its
``before_model_callback``, calling the simulator through ADK's ``LiteLlm`` model client: a
30-step tool loop where every request is within the trigger (system instruction and tool
declarations counted) and valid, while the ADK session keeps every event."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
pytest.importorskip("google.adk")
pytest.importorskip("litellm")

from google.adk.agents import LlmAgent  # noqa: E402
from google.adk.models.lite_llm import LiteLlm  # noqa: E402
from google.adk.runners import Runner  # noqa: E402
from google.adk.sessions import InMemorySessionService  # noqa: E402
from google.genai import types  # noqa: E402

from agentcompact import Budget, ConfigError, Engine  # noqa: E402
from agentcompact.integrations.adk import CompactionCallback, GenAIDialect  # noqa: E402
from agentcompact.testing import RunningServer, Script, UpstreamSim, serve  # noqa: E402

from .conftest import sent_tokens  # noqa: E402
from .hosts_loop import DONE, check_requests, step_output, tool_loop  # noqa: E402

pytestmark = pytest.mark.network

TRIGGER = 3000
STEPS = 30
INSTRUCTION = "You are a careful engineer. " * 150


def read_file(path: str) -> str:
    """Read a file of the repository."""
    return step_output(path, 700)


@pytest.fixture
def server() -> Iterator[RunningServer]:
    with serve(UpstreamSim(Script(then=tool_loop(STEPS)))) as running:
        yield running


async def _run(server: RunningServer, callback: Any, **agent_options: Any) -> tuple[str, Any]:
    model = LiteLlm(model="openai/sim-model", api_base=f"{server.base_url}/v1",
                    api_key="sk-test")
    agent = LlmAgent(name="engineer", model=model, instruction=INSTRUCTION,
                     tools=[read_file], before_model_callback=callback, **agent_options)
    sessions = InMemorySessionService()
    runner = Runner(app_name="hosts", agent=agent, session_service=sessions)
    session = await sessions.create_session(app_name="hosts", user_id="u")
    final = ""
    message = types.Content(role="user", parts=[types.Part(text="Read every step file.")])
    async for event in runner.run_async(user_id="u", session_id=session.id,
                                        new_message=message):
        if event.is_final_response() and event.content and event.content.parts:
            final = event.content.parts[0].text or ""
    stored = await sessions.get_session(app_name="hosts", user_id="u", session_id=session.id)
    return final, stored


async def test_tool_loop_stays_within_trigger(server: RunningServer) -> None:
    callback = CompactionCallback(budget=Budget(trigger_tokens=TRIGGER))
    final, session = await _run(server, callback)
    assert final == DONE
    bodies = [r.body for r in server.requests if r.path == "/v1/chat/completions"]
    assert len(bodies) == STEPS + 1
    assert max(sent_tokens(b) for b in bodies) <= TRIGGER
    check_requests(bodies, "openai_chat")
    assert any("[agentcompact" in str(b["messages"]) for b in bodies)
    # the session keeps every event: each tool call and its response
    calls = sum(1 for e in session.events for p in (e.content.parts if e.content else ())
                if p.function_call is not None)
    assert calls == STEPS


async def test_recorded_calls_export_to_rows(server: RunningServer, pm: Any, collector: Any,
                                             tmp_path: Path) -> None:
    """With ``after_model_callback=callback.record`` every model call is logged as the
    Gemini API's JSON (the contents sent, compacted, and the model's content), and the
    recording exports to training rows holding the instruction and the tool."""
    pytest.importorskip("tokenizers")
    from agentcompact.plugins.recorder import Recorder
    from agentcompact.trajectory.export import export_runs

    from ..conftest import QWEN_TOKENIZER

    recorder = Recorder(tmp_path / "run")
    pm.register(recorder)
    callback = CompactionCallback(budget=Budget(TRIGGER), plugins=pm)
    final, _ = await _run(server, callback, after_model_callback=callback.record)
    recorder.close()
    assert final == DONE
    calls = collector.calls
    assert len(calls) == STEPS + 1 and {c.dialect for c in calls} == {"gemini"}
    assert any(c.compacted for c in calls)
    first = calls[0]
    assert first.request["systemInstruction"]["parts"][0]["text"].startswith(INSTRUCTION[:40])
    assert first.request["tools"][0]["functionDeclarations"][0]["name"] == "read_file"
    assert first.response[0]["parts"][0]["functionCall"]["name"] == "read_file"
    # what was logged is what the callback let through: the compacted contents
    assert sum(len(c.messages) for c in calls) < sum(range(1, 2 * STEPS + 3, 2))
    manifest = export_runs([tmp_path / "run"], tmp_path / "rows", str(QWEN_TOKENIZER))
    assert manifest["counts"]["model_calls"] == STEPS + 1
    assert manifest["counts"]["segments"] >= 2  # a compaction starts a new segment
    pq = pytest.importorskip("pyarrow.parquet")
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(QWEN_TOKENIZER / "tokenizer.json"))
    rows = pq.read_table(tmp_path / "rows" / "segments-00000.parquet").to_pylist()
    prompt = tok.decode(rows[0]["prompt_ids"])
    assert INSTRUCTION[:40] in prompt and '"name": "read_file"' in prompt
    trained = tok.decode([t for t, m in zip(rows[-1]["response_ids"], rows[-1]["response_mask"])
                          if m])
    assert trained.endswith(DONE)


def test_dialect_pairs_calls_and_keeps_signed_parts() -> None:
    d = GenAIDialect()
    call = types.Content(role="model", parts=[types.Part(
        function_call=types.FunctionCall(id="c1", name="read_file", args={"path": "a"}),
        thought_signature=b"sig")])
    answer = types.Content(role="user", parts=[types.Part(
        function_response=types.FunctionResponse(id="c1", name="read_file",
                                                 response={"result": "x" * 5000}))])
    assert d.tool_call_ids(call) == ("c1",) and d.tool_result_ids(answer) == ("c1",)
    assert d.truncate(call, 10) is call
    cut = d.truncate(answer, 200)
    assert cut is not answer and len(str(cut.parts[0].function_response.response)) < 1000
    assert answer.parts[0].function_response.response["result"] == "x" * 5000


def test_options_are_checked_when_built() -> None:
    with pytest.raises(ConfigError, match="trigger_tokens"):
        CompactionCallback()
    with pytest.raises(ConfigError, match="GenAIDialect"):
        CompactionCallback(Engine(dialect="openai_chat", budget=Budget(trigger_tokens=1000)))
