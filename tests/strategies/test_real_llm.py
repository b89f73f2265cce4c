"""Opt-in: both LLM strategies against a real model.

Skipped unless ``AGENTCOMPACT_TEST_LLM_URL`` names an OpenAI-compatible base URL (with
``/v1``), e.g. the Qwen2.5-Coder-0.5B server of ``../shared/tools/local-llm/setup.sh``.
``AGENTCOMPACT_TEST_LLM_MODEL`` names the model (default ``local``).
"""

from __future__ import annotations

import os

import pytest

from agentcompact import Engine, validate
from agentcompact.markers import SUMMARY_HEADER

from .conftest import history, text_of

URL = os.environ.get("AGENTCOMPACT_TEST_LLM_URL")
pytestmark = [pytest.mark.network, pytest.mark.slow,
              pytest.mark.skipif(not URL, reason="AGENTCOMPACT_TEST_LLM_URL not set")]


@pytest.mark.parametrize("strategy", ["summary", "parallel"])
async def test_real_model_summarizes(strategy: str, pm, log) -> None:
    settings = {"base_url": URL, "model": os.environ.get("AGENTCOMPACT_TEST_LLM_MODEL", "local"),
                "api_key": "local", "timeout": 300, "context_window": 8_000,
                "max_retries": 1}
    if strategy == "parallel":
        settings.update(block_tokens=1_500, max_concurrency=2)
    engine = Engine(strategy=strategy, plugins=pm, trigger_tokens=6_000, target_tokens=3_000,
                    strategy_settings=settings)
    result = await engine.acompact(history(14))
    assert result.compacted
    validate(result.messages, engine.dialect, allow_pending=True)
    summary = text_of(result.messages[2])
    assert summary.startswith(SUMMARY_HEADER) and len(summary) > len(SUMMARY_HEADER) + 20
    assert all(e.error is None for e in log.events), [e.error for e in log.events]
    assert log.calls and all(c.usage for c in log.calls)
