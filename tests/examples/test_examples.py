"""Every file under examples/ runs as a user would run it: against the simulated provider
started by its own command line (``python -m agentcompact.testing --script tool-loop``),
in a fresh process, from an empty folder; each shows a compaction. Each doc shows its
example verbatim: the fenced block after ``<!-- example: examples/NAME -->`` is the file."""

from __future__ import annotations

import ast
import importlib.util
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.network

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
#: the pages that show an example file, and the file
SHOWN = {
    "README.md": "quickstart.py",
    "docs/langgraph.md": "langgraph_agent.py",
    "docs/llamaindex.md": "llamaindex_agent.py",
    "docs/sdk.md": "sdk_openai.py",
    "docs/proxy.md": "proxy_client.py",
    "docs/rl-export.md": "rl_record.py",
    "docs/expand.md": "expand_dropped.py",
    "docs/replay.md": "replay.sh",
    "docs/strategies/summary.md": "summary_strategy.py",
}
#: what each example prints when it shows a compaction
SHOWS = {
    "quickstart.py": r"\(compacted\)",
    "langgraph_agent.py": r"compaction: [\d,]+ -> [\d,]+ tokens",
    "llamaindex_agent.py": r"compaction: [\d,]+ -> [\d,]+ tokens",
    "sdk_openai.py": r"compaction: [\d,]+ -> [\d,]+ tokens",
    "proxy_client.py": r"the provider received",
    "rl_record.py": r"model calls, [1-9]\d* compactions",
    "expand_dropped.py": r"expand\('ac-[0-9a-f]{12}'\)",
    "replay.sh": r"cliff +\d+ +[1-9]",
    "summary_strategy.py": r"summary compaction: [\d,]+ -> [\d,]+ tokens",
}
#: examples that start their own simulated provider, each run (and compared with its guide)
#: by the tests of its integration
SELF_CONTAINED = {
    "adk_callback.py": "tests/integrations/test_host_examples.py",
    "litellm_callback.py": "tests/integrations/test_host_examples.py",
    "openai_agents_filter.py": "tests/integrations/test_host_examples.py",
    "pydantic_ai_capability.py": "tests/integrations/test_host_examples.py",
    "gemini_proxy.py": "tests/integrations/test_gemini_example.py",
}
INCLUDE = re.compile(r"<!-- example: examples/([\w.]+) -->\n```\w*\n(.*?)^```", re.M | re.S)
SIM_URL = re.compile(r"on (http://127\.0\.0\.1:\d+)")


def _files() -> list[str]:
    return sorted(p.name for p in EXAMPLES.iterdir() if p.suffix in (".py", ".sh"))


def test_every_example_is_shown_and_checked() -> None:
    assert sorted(SHOWN.values()) == sorted(SHOWS)
    assert sorted([*SHOWN.values(), *SELF_CONTAINED]) == _files()
    for name, test in SELF_CONTAINED.items():
        assert name in (ROOT / test).read_text(encoding="utf-8"), f"{test} does not run {name}"


@pytest.mark.parametrize("page", sorted(SHOWN))
def test_the_page_shows_its_example_verbatim(page: str) -> None:
    shown = INCLUDE.findall((ROOT / page).read_text(encoding="utf-8"))
    assert shown, f"{page}: no <!-- example: examples/{SHOWN[page]} --> block"
    for name, block in shown:
        assert block == (EXAMPLES / name).read_text(encoding="utf-8"), \
            f"{page} shows examples/{name} differently: copy the file into the page"


@pytest.fixture(scope="module")
def simulator() -> Iterator[str]:
    """The simulated provider, started as the examples' docstrings say."""
    process = subprocess.Popen(
        [sys.executable, "-m", "agentcompact.testing", "--script", "tool-loop", "--port", "0"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    assert process.stderr is not None
    try:
        found = SIM_URL.search(process.stderr.readline())
        assert found, "the simulator did not announce its address"
        yield found.group(1)
    finally:
        process.terminate()
        process.wait(timeout=30)
        process.stderr.close()


def _third_party(example: Path) -> list[str]:
    """Top-level modules the example imports that are not agentcompact's or the stdlib's."""
    if example.suffix != ".py":
        return []
    tree = ast.parse(example.read_text(encoding="utf-8"))
    names = {alias.name.split(".")[0] for node in ast.walk(tree)
             if isinstance(node, ast.Import) for alias in node.names}
    names |= {node.module.split(".")[0] for node in ast.walk(tree)
              if isinstance(node, ast.ImportFrom) and node.module and not node.level}
    return sorted(n for n in names - {"agentcompact"} if n not in sys.stdlib_module_names)


def _command(name: str, sim: str) -> list[str]:
    path = str(EXAMPLES / name)
    if name == "proxy_client.py":  # as its docstring runs it: behind agentcompact run
        return [sys.executable, "-m", "agentcompact", "run", "--trigger", "2000",
                "--openai-upstream", sim, "--", sys.executable, path]
    if name.endswith(".sh"):
        return ["sh", path]
    return [sys.executable, path]


@pytest.mark.parametrize("name", sorted(SHOWS))
def test_the_example_runs_and_shows_a_compaction(name: str, simulator: str,
                                                 tmp_path: Path) -> None:
    for module in _third_party(EXAMPLES / name):
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"examples/{name} needs {module} (its extra is not installed)")
    env = {**os.environ, "OPENAI_BASE_URL": f"{simulator}/v1", "ANTHROPIC_BASE_URL": simulator,
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
           "PYTHONWARNINGS": "error::DeprecationWarning:__main__"}
    env.pop("OPENAI_API_KEY", None)
    env.pop("ANTHROPIC_API_KEY", None)
    done = subprocess.run(_command(name, simulator), cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    assert re.search(SHOWS[name], done.stdout), done.stdout[-2000:]
    assert "Traceback" not in done.stderr


def test_the_recorded_run_exports(simulator: str, tmp_path: Path) -> None:
    """rl_record.py's run, exported as its docstring says (the shared Qwen tokenizer)."""
    pytest.importorskip("pyarrow")
    pytest.importorskip("transformers")
    tokenizer = ROOT.parent / "shared" / "data" / "tokenizers" / "qwen2.5-coder-0.5b-instruct"
    if not tokenizer.is_dir():
        pytest.skip(f"needs the shared tokenizer at {tokenizer}")
    env = {**os.environ, "OPENAI_BASE_URL": f"{simulator}/v1"}
    subprocess.run([sys.executable, str(EXAMPLES / "rl_record.py"), "runs/demo"], cwd=tmp_path,
                   env=env, check=True, capture_output=True, timeout=300)
    done = subprocess.run([sys.executable, "-m", "agentcompact", "export", "runs/demo", "--out",
                           "rows", "--tokenizer", str(tokenizer)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert re.search(r"exported [1-9]\d* segments of 4 episodes in 1 groups", done.stdout)


#: the extras each example's page tells the user to install
EXTRAS = {
    "quickstart.py": ["sdk"], "langgraph_agent.py": ["langgraph"],
    "llamaindex_agent.py": ["llamaindex"], "sdk_openai.py": ["sdk"], "proxy_client.py": [],
    "rl_record.py": ["sdk", "export"], "expand_dropped.py": ["sdk"],
    "summary_strategy.py": ["sdk"], "replay.sh": [],
    "litellm_callback.py": ["litellm", "testing"],
    "openai_agents_filter.py": ["openai-agents", "testing"],
    "pydantic_ai_capability.py": ["pydantic-ai", "testing"],
    "adk_callback.py": ["adk", "testing"], "gemini_proxy.py": ["proxy"],
}
#: import names that differ from their distribution's
DISTRIBUTION = {"agents": "openai_agents"}
#: the client a page tells the user to install beside the extras
CLIENTS = {"gemini_proxy.py": ["google-genai"]}


def test_each_example_imports_only_what_its_extras_install() -> None:
    tomllib = pytest.importorskip("tomllib", reason="Python 3.11+ reads pyproject.toml")
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    assert set(EXTRAS) == set(_files())
    for name, wanted in EXTRAS.items():
        specs = [spec for extra in wanted for spec in extras[extra]] + CLIENTS.get(name, [])
        installed = {re.split(r"[<>=\[; ]", spec)[0].lower().replace("-", "_")
                     for spec in specs}
        # a dependency's own extras (pydantic-ai-slim[openai]) install those packages too
        installed |= {extra.strip().lower().replace("-", "_") for spec in specs
                      for extra in re.findall(r"\[([^\]]+)\]", spec)[0:1]
                      for extra in extra.split(",")}
        for module in _third_party(EXAMPLES / name):
            assert any(dist == module or dist.startswith(f"{module}_") or
                       dist.replace("_", "") == module.replace("_", "")
                       or (module == "llama_index" and dist.startswith("llama_index"))
                       or DISTRIBUTION.get(module) == dist
                       for dist in installed), f"examples/{name} imports {module}: not in {wanted}"
    assert "llama_index_llms_openai_like" in {
        re.split(r"[<>=]", s)[0].replace("-", "_") for s in extras["llamaindex"]}
    assert any(s.startswith("langchain-openai") for s in extras["langgraph"])
