"""The scripts that measure issues #12 and #33 figures run end to end (small settings).

The benchmarks are not imported by the package, so nothing else notices when a change
elsewhere breaks one: ``core_fuzz_and_scale.py`` stopped before printing any figure for
two sessions after the fuzz suite's engine settings became a function of the summarizer's
URL. Each script is run as a user runs it, in a process of its own.
"""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from .conftest import ROOT, needs_shared_data

pytestmark = pytest.mark.slow


def run_script(name: str, *args: str) -> str:
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / name), *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


@pytest.mark.network  # the LLM strategies summarize through the loopback simulator
def test_core_fuzz_and_scale_prints_every_figure() -> None:
    pytest.importorskip("starlette")
    pytest.importorskip("openai")
    pytest.importorskip("langchain_core")
    out = run_script("core_fuzz_and_scale.py", "--examples", "3")
    assert re.search(r"^1M-token history \([\d,]+ tokens, [\d,]+ messages\), one message added: "
                     r"same objects [\d.]+ ms/call", out, re.M), out
    for dialect in ("openai_chat", "anthropic", "openai_responses", "langchain"):
        found = re.search(rf"^fuzz {dialect} +histories +(\d+) +calls +(\d+) +violations (\d+)$",
                          out, re.M)
        assert found, out
        histories, calls, violations = map(int, found.groups())
        assert 1 <= histories <= 3 and calls >= histories and violations == 0, found.group(0)


@needs_shared_data("trajectories", "mini-swe-agent-pr816-deepseek")
def test_core_vs_cliffcompaction_prints_both_sets() -> None:
    pytest.importorskip("cliffcompaction")
    out = run_script("core_vs_cliffcompaction.py", "--mode", "objects", "--clock", "cpu")
    for name, calls in (("claude-code", 529), ("mini-swe-agent", 2117)):
        row = re.search(rf"^{name} +objects +(\d+) +([\d.]+) +([\d.]+) +([\d.]+) .* "
                        r"(\d+)/(\d+) +(\d+)/(\d+) *$", out, re.M)
        assert row, out
        assert int(row.group(1)) == calls
        assert float(row.group(4)) > 0  # the time ratio
        assert row.group(5) == "0"  # none of our outputs is invalid
        assert row.group(7) == "0"  # none of ours is over the trigger


@pytest.mark.network  # the frameworks call the loopback simulator
def test_hosts_bound_prints_every_arm() -> None:
    for module in ("pydantic_ai", "agents", "litellm", "google.adk"):
        pytest.importorskip(module)
    out = run_script("hosts_bound.py", "--steps", "6", "--system", "1000", "--result", "800",
                     "--trigger", "4000")
    for framework, arms in (("litellm", 3), ("openai-agents", 3), ("pydantic-ai", 2),
                            ("adk", 3)):
        rows = re.findall(rf"^{framework} +.+ +\d+ +\d+ +(yes|no) +[\d.]+ +\d/7 +(\d+)$",
                          out, re.M)
        assert len(rows) == arms, out
        assert all(invalid == "0" for _, invalid in rows), out
    assert re.search(r"^pydantic-ai +agentcompact +\d+ +\d+ +yes ", out, re.M), out


@pytest.mark.network  # its servers listen on loopback
@needs_shared_data("tokenizers", "qwen2.5-coder-0.5b-instruct")
def test_gateway_latency_prints_every_figure() -> None:
    pytest.importorskip("uvicorn")
    pytest.importorskip("pyarrow")
    pytest.importorskip("transformers")
    out = run_script("gateway_latency.py", "--size", "4000", "--steps", "3", "--warmup", "1")
    for key in ("direct_p50_ms", "relay_added_p50_ms", "proxy_added_p50_ms",
                "gateway_added_p50_ms", "gateway_worker_cpu_ms_per_call",
                "gateway_loop_cpu_ms_per_call"):
        assert re.search(rf"^  {key} +-?[\d.]+$", out, re.M), out
    calls = re.search(r"^  calls_recorded +(\d+)$", out, re.M)
    assert calls and int(calls.group(1)) == 4, out  # every call of the session recorded


@needs_shared_data("trajectories", "claude-code")
def test_fidelity_canaries_prints_both_halves() -> None:
    """#33's suite, quick: one seed of the smallest run of each family and half; both
    engines at a matched real peak, every figure printed for each half."""
    pytest.importorskip("cliffcompaction")
    out = run_script("fidelity_canaries.py", "--quick")
    assert re.search(r"^\d+ sessions with tool calls; \d+ runs$", out, re.M), out
    kinds: set[str] = set()
    for half in ("held-out", "tuning"):
        section = out.split(f"## {half} half:")[1].split("## ")[0]
        assert re.search(r"^cost with caching, agentcompact / CliffCompaction: \d\.\d{3}$",
                         section, re.M), section
        assert re.search(r"^recall in context: agentcompact \d\.\d{3} \(one expand away "
                         r"\d\.\d{3}\), CliffCompaction \d\.\d{3}", section, re.M), section
        assert re.search(r"^recall gap \(agentcompact - CliffCompaction\) [+-]\d\.\d{3}, 95% "
                         r"interval [+-]\d\.\d{3} to [+-]\d\.\d{3}; cost ratio 95% interval "
                         r"\d\.\d{3} to \d\.\d{3} ", section, re.M), section
        peak = re.search(r"^largest request / trigger: agentcompact ([\d.]+), CliffCompaction "
                         r"[\d.]+ \(calibrated; (\d+) runs over the matched peak\)$",
                         section, re.M)
        assert peak and float(peak.group(1)) <= 1.0 and peak.group(2) == "0", section
        assert "fallbacks 0" in section
        assert re.search(r"^\| all \| \d+/\d+ ", section, re.M), section
        kinds.update(re.findall(r"^\| (\w+) \| \d+/\d+ ", section, re.M))
        for table in ("carrier", "position", "depth decile", "compactions since (own count)",
                      "family", "length band"):
            assert f"| {table} | agentcompact | + expand | CliffCompaction |" in section
    assert {"path", "command", "number", "error", "decision", "rule", "safety"} <= kinds


def test_fidelity_shortfalls_carry_the_paired_counts_and_p(monkeypatch: pytest.MonkeyPatch
                                                           ) -> None:
    """A cell where agentcompact keeps fewer canaries is printed with the canaries only
    each engine keeps and McNemar's exact p (0 vs 3 alone: 2 x 1/8)."""
    pytest.importorskip("cliffcompaction")
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import fidelity_canaries as fc

    assert fc._mcnemar(0, 3) == 0.25 and fc._mcnemar(3, 0) == 0.25
    assert round(fc._mcnemar(4, 7), 3) == 0.549  # 2 x (1 + 11 + 55 + 165 + 330) / 2^11
    assert fc._mcnemar(0, 0) == fc._mcnemar(6, 6) == 1.0
    kept = [(True, True), (False, True), (False, True), (False, True), (False, False)]
    canaries = [{"kind": "path", "ours": a, "peer": b} for a, b in kept]
    result = {"family": "claude-code", "tokens": 80_000, "key": "k", "canaries": canaries}
    assert ("kind / path: 1/5 vs 4/5 (alone 0 / 3, p 0.25)"
            in fc._shortfalls([result]))


@pytest.mark.network
def test_proxy_faults_prints_every_figure() -> None:
    """``benchmarks/proxy_faults.py`` with small settings: a 3 s lock, a 10 MB answer,
    400 and 800 turns twice."""
    pytest.importorskip("uvicorn")
    out = run_script("proxy_faults.py", "--hold", "3", "--big-mb", "10", "--turns", "400",
                     "--repeats", "2")
    assert re.search(r"^store: write lock held 3 s by another process; session A's largest "
                     r"gap [\d.]+ s before, [\d.]+ s during", out, re.M), out
    assert "status during: ['degraded']; after: ok, 0 writes pending" in out, out
    assert re.search(r"^record: per-token CPU time at 64k over 8k tokens: [\d.]+", out, re.M)
    assert re.search(r"SIGTERM right after a 100 MB answer: the proxy exited in [\d.]+ s, "
                     r"that answer recorded", out), out
    assert re.search(r"^history: 800 over 400 turns, medians of 2: wall [\d.]+x \(.*\), "
                     r"proxy CPU [\d.]+x \(.*\)$", out, re.M), out


@pytest.mark.network
def test_proxy_soak_counts_lost_posts_in_both_settings() -> None:
    pytest.importorskip("httpx")
    out = run_script("proxy_soak.py", "--requests", "96", "--sessions", "8", "--idle", "0.5",
                     "--compare-keep-alive", "5")
    assert re.search(r"keep-alive 5 s, idle 0.5 s\): \d+ streamed requests, 0 POSTs lost", out)
    assert re.search(r"keep-alive default, idle 0.5 s\): \d+ streamed requests, 0 POSTs lost",
                     out), out
