"""What ``agentcompact demo`` prints: the figures, one line on each, and an excerpt of what
the last model call was sent instead of the full history."""

from __future__ import annotations

import json
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ._demo import DemoReport

__all__ = ["print_demo"]

_WIDTH = 55  # characters of each excerpt line: 22 of indent, under 80 in all
_COMPACTION_LINES = 4


def print_demo(report: DemoReport, turns: int, console: Console) -> None:
    console.print(_figures(report, turns))
    for text in (_EXPLAINED, _excerpt(report), _NEXT):
        console.print(text, highlight=False, soft_wrap=True)


def _figures(report: DemoReport, turns: int) -> Table:
    table = Table(title=f"cliff on a built-in {turns}-turn coding-agent session",
                  title_justify="left")
    table.add_column("figure")
    table.add_column("cliff", justify="right")
    table.add_column("full history", justify="right")
    table.add_row("model calls", f"{report.calls:,}", f"{report.calls:,}")
    table.add_row("compactions", f"{report.compactions:,}", "0")
    table.add_row("peak context (tokens)", f"{report.peak_tokens:,}",
                  f"{report.full_peak_tokens:,}")
    table.add_row("trigger (tokens)", f"{report.trigger:,}", "-")
    table.add_row("cached-prefix share", f"{report.cached_share:.1%}",
                  f"{report.full_cached_share:.1%}")
    table.add_row("input cost with prompt caching", f"{report.cost_ratio:.2f}×", "1.00×")
    table.add_row("engine time per call", f"{report.engine_ms_per_call:.2f} ms", "-")
    return table


_EXPLAINED = """\
[bold]model calls[/bold]: the agent's requests; each is compacted, then sent
[bold]compactions[/bold]: calls over the trigger, cut down to the target
[bold]peak context[/bold]: the largest context one call sent (o200k_base tokens)
[bold]trigger[/bold]: the context size that starts a compaction (--trigger)
[bold]cached-prefix share[/bold]: input that repeats the previous call's prefix,
  so the provider's prompt cache serves it
[bold]input cost[/bold]: against the full history; cache reads 0.1×, writes 1.25×
[bold]engine time[/bold]: what compacting costs per call, on this machine
"""


def _excerpt(report: DemoReport) -> str:
    kept = {id(m) for m in report.history}
    lines = [f"[bold]The last call[/bold]: the history held {len(report.history):,} messages "
             f"({report.history_tokens:,} tokens);",
             f"cliff sent {len(report.sent):,} ({report.sent_tokens:,} tokens):"]
    tail_start = None
    for index, message in enumerate(report.sent):
        if id(message) in kept and index >= report.head_len:
            tail_start = index
            break
        role = message.get("role", "?")
        text = _text(message.get("content"))
        if id(message) in kept:
            lines.append(f"  kept      {role:<9} {escape(_clip(text))}")
            continue
        rows = text.splitlines() or [""]
        lines.append(f"  [green]compacted[/green] {role:<9} {escape(_clip(rows[0]))}")
        shown = [row for row in rows[1:] if row.strip()][:_COMPACTION_LINES]
        lines += [f"{'':22}{escape(_clip(row))}" for row in shown]
        lines.append(f"{'':22}[dim]… {len(rows):,} lines: what was dropped, as skim lines[/dim]")
        lines.append(f"{'':22}[dim]and truncated outputs, each with a handle to expand[/dim]")
    if tail_start is not None:
        newest = len(report.sent) - tail_start
        lines.append(f"  kept      the newest {newest} messages, verbatim "
                     f"(history[{len(report.history) - newest}:])")
    return "\n".join(lines) + "\n"


def _text(content: Any) -> str:
    """The readable text of an Anthropic message's content."""
    if isinstance(content, str):
        return content
    parts = []
    for block in content if isinstance(content, list) else []:
        kind = block.get("type")
        if kind == "text":
            parts.append(block.get("text", ""))
        elif kind == "tool_use":
            parts.append(f"[tool call {block.get('name')}] {json.dumps(block.get('input'))}")
        elif kind == "tool_result":
            parts.append(f"[tool result] {_text(block.get('content'))}")
    return "\n".join(parts)


def _clip(text: str, width: int = _WIDTH) -> str:
    line = " ".join(text.split())
    return line if len(line) <= width else line[: width - 1] + "…"


_NEXT = """\
Next, every call of your own sessions beside other strategies, as HTML charts:
  agentcompact replay ~/.claude/projects --report replay.html
or of this session:
  agentcompact demo --save demo.json
  agentcompact replay demo.json --report demo.html"""
