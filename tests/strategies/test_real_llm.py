"""Opt-in: both LLM strategies against a real model, through ``Engine(base_url=, model=)``.

Skipped unless ``AGENTCOMPACT_TEST_LLM_URL`` names an OpenAI-compatible base URL (with
``/v1``), e.g. the Qwen2.5-Coder-0.5B server of ``../shared/tools/local-llm/setup.sh``::

    AGENTCOMPACT_TEST_LLM_URL=http://127.0.0.1:8089/v1 pytest tests/strategies/test_real_llm.py

``AGENTCOMPACT_TEST_LLM_MODEL`` names the model (default ``local``) and
``AGENTCOMPACT_TEST_LLM_WINDOW`` its context window (default 8192). The session is sized
for a small CPU model serving one request at a time (a ~1.3k-token history, summary
budgets of ~250 tokens: about a minute for both tests). What is asserted does not depend on
the model's wording: a non-empty summary under the header, prompts holding original
messages only, a valid output under the target, no error, usage logged — and that at
least one salient item of the compacted span (a file path, the error, the command) made
it into the summary, which a summary worth the name keeps.
"""

from __future__ import annotations

import json
import os
from typing import Any

import pytest

from agentcompact import Budget, Engine, StrategySettings, validate
from agentcompact._markers import COMPACTION_HEADER, SUMMARY_HEADER

from .conftest import text_of

URL = os.environ.get("AGENTCOMPACT_TEST_LLM_URL")
MODEL = os.environ.get("AGENTCOMPACT_TEST_LLM_MODEL", "local")
WINDOW = int(os.environ.get("AGENTCOMPACT_TEST_LLM_WINDOW", "8192"))
pytestmark = [pytest.mark.network, pytest.mark.slow,
              pytest.mark.skipif(not URL, reason="AGENTCOMPACT_TEST_LLM_URL not set")]

TRIGGER, TARGET = 900, 650

REFUND_PY = "\n".join(f"{n:4d}  {line}" for n, line in enumerate([
    '"""Refunds for orders paid by card or bank transfer."""', "",
    "from decimal import Decimal", "", "from .rates import RATES",
    "from .ledger import post_entry", "", "MAX_REFUND_DAYS = 90", "",
    "class RefundError(Exception):", '    """A refund that cannot be made."""', "",
    "def _check_window(order, today):",
    "    if (today - order['paid_on']).days > MAX_REFUND_DAYS:",
    "        raise RefundError(f\"order {order['id']} is older than {MAX_REFUND_DAYS} days\")",
    "", "def refund(order, amount_cents, today=None):",
    '    """Refund part of an order; returns the refunded amount in the account currency."""',
    "    if amount_cents <= 0:", "        raise ValueError('amount must be positive')",
    "    if amount_cents > order['total_cents']:",
    "        raise RefundError('refund larger than the order')",
    "    if today is not None:", "        _check_window(order, today)",
    "    rate = RATES[order['currency']]", "    refunded = round(amount_cents * rate)",
    "    post_entry(order['account'], -refunded, memo=f\"refund {order['id']}\")",
    "    return refunded"], start=1))
LEDGER_FAIL = """........................F.
=================================== FAILURES ===================================
_________________________________ test_balance _________________________________

    def test_balance():
        ledger = Ledger(rate=Decimal('1.5'))
        ledger.post(999)
>       assert ledger.balance() == 1500
E       AssertionError: assert 1499 == 1500
E        +  where 1499 = <Ledger account=acc-7>.balance()

tests/test_ledger.py:22: AssertionError
=========================== short test summary info ============================
FAILED tests/test_ledger.py::test_balance - AssertionError: assert 1499 == 1500
1 failed, 25 passed in 1.31s"""

# a short, realistic coding session: the early turns hold the facts a summary must keep
STEPS: list[tuple[str, str, str]] = [
    ("Look at the failing test first.", "pytest tests/test_refund.py -x -q",
     "F\n___ test_refund_partial ___\n    def test_refund_partial():\n>       "
     "assert refund(order, 500) == 500\nsrc/payments/refund.py:41: in refund\n    "
     "rate = RATES[order['currency']]\nE   KeyError: 'currency'\n1 failed in 0.12s"),
    ("The order dict has no currency key. Let me read refund.py.",
     "cat -n src/payments/refund.py", REFUND_PY),
    ("Orders created before v2.3 have no currency; default to EUR.",
     "sed -i \"41s/order\\['currency'\\]/order.get('currency', 'EUR')/\" "
     "src/payments/refund.py", "(no output)"),
    ("Run the test again.", "pytest tests/test_refund.py -x -q",
     "...\n3 passed in 0.10s"),
    ("Now the full suite.", "pytest -q",
     LEDGER_FAIL),
    ("Rounding in the ledger: check src/payments/ledger.py.",
     "grep -n round src/payments/ledger.py",
     "17:    return int(total * rate)  # truncates\n58:    return round(x, 2)"),
    ("Line 17 truncates instead of rounding.",
     "sed -i '17s/int(total \\* rate)/round(total * rate)/' src/payments/ledger.py",
     "(no output)"),
    ("Run the suite again.", "pytest -q", "..........................\n26 passed in 1.28s"),
    ("All green. Check the diff before finishing.", "git diff --stat",
     " src/payments/ledger.py | 2 +-\n src/payments/refund.py | 2 +-\n"
     " 2 files changed, 2 insertions(+), 2 deletions(-)"),
    ("Done; summarize the change for the user.", "git log -1 --oneline",
     "a1b2c3d fix refund currency default and ledger rounding"),
]
SALIENT = ("refund.py", "ledger.py", "KeyError", "currency", "test_refund", "EUR")


def session() -> list[dict[str, Any]]:
    msgs: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a coding agent working in a git repository."},
        {"role": "user", "content": "Fix the failing payment tests. Do not change the "
                                    "public API of src/payments and never edit setup.cfg."}]
    for k, (thought, cmd, output) in enumerate(STEPS):
        call = {"id": f"call_{k}", "type": "function",
                "function": {"name": "bash", "arguments": json.dumps({"command": cmd})}}
        msgs.append({"role": "assistant", "content": thought, "tool_calls": [call]})
        msgs.append({"role": "tool", "tool_call_id": f"call_{k}", "content": output})
    return msgs


@pytest.mark.parametrize("strategy", ["summary", "parallel"])
async def test_real_model_summarizes(strategy: str, pm, log) -> None:
    settings: dict[str, Any] = {"timeout": 300, "context_window": WINDOW, "max_retries": 1}
    if strategy == "parallel":
        settings.update(blocks=2, max_concurrency=2)
    engine = Engine(strategy=StrategySettings(strategy, options=settings, base_url=URL, model=MODEL,
                                              api_key="local"),
                    plugins=pm, budget=Budget(trigger_tokens=TRIGGER, target_tokens=TARGET))
    msgs = session()
    assert TRIGGER < engine.count(msgs) < 2_000  # sized for a small CPU model
    result = await engine.acompact(msgs)

    assert result.compacted and result.event is not None
    assert result.event.error is None and result.event.fallback is None, result.event.error
    assert not result.event.errors  # parallel: no block fell back to cliff
    validate(result.messages, engine.dialect, allow_pending=True)
    assert result.messages[:2] == msgs[:2]  # the head is verbatim
    assert result.messages[3:] == msgs[result.cut:]  # the recent turns too
    assert result.tokens_after <= TARGET
    summary = text_of(result.messages[2])
    assert summary.startswith(SUMMARY_HEADER)
    body = summary.removeprefix(SUMMARY_HEADER).strip()
    assert len(body) > 40 and "[verbatim excerpts" not in body
    found = [s for s in SALIENT if s in body]
    assert found, f"no salient item of the span survived: {body!r}"

    # one call per block (parallel: 2), each from original messages only, with usage
    assert len(log.calls) == (2 if strategy == "parallel" else 1)
    for call in log.calls:
        assert call.error is None and call.output and call.usage
        prompt = "\n".join(str(m["content"]) for m in call.prompt)
        assert SUMMARY_HEADER not in prompt and COMPACTION_HEADER not in prompt
        assert "refund" in prompt or "ledger" in prompt  # the span's originals
    print(f"\n{strategy}: {result.tokens_before} -> {result.tokens_after} tokens; "
          f"latency {result.event.latency_s:.1f} s; salient kept: {found}\n{body}")
