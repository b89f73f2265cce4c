"""The replay report as one self-contained HTML file: inline CSS and SVG, no script, no
network — it opens offline and prints.

Sections: the settings; a totals table per strategy (skipped strategies with the reason);
then per session three charts — context size sent at each call (the cliff sawtooth; the
trigger as a dashed line; the harness's own compactions as grey marks), cumulative input
cost, and the cached-prefix share of each call — and the compaction record of every
strategy (what each compaction dropped and which salient items went).
"""

from __future__ import annotations

import datetime as _dt
import html
import itertools
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ._replay import ReplayReport, StrategyRun, TrajectoryReplay

__all__ = ["MAX_SESSIONS", "line_chart", "render_html", "write_html"]

#: sessions drawn in full; the rest are in the totals only
MAX_SESSIONS = 30
_PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2",
            "#17becf", "#7f7f7f", "#bcbd22")
_CSS = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px;color:#222}
h1{font-size:22px;margin:0 0 4px}h2{font-size:18px;margin:28px 0 6px;border-top:1px solid #ddd;
padding-top:14px}h3{font-size:15px;margin:14px 0 4px}
table{border-collapse:collapse;margin:8px 0}td,th{border:1px solid #ddd;padding:3px 8px;
text-align:right}th{background:#f4f4f4}td:first-child,th:first-child{text-align:left}
.muted{color:#777}.swatch{display:inline-block;width:10px;height:10px;margin-right:5px}
svg{display:block;margin:6px 0}details{margin:4px 0}summary{cursor:pointer}
code{background:#f4f4f4;padding:0 3px}.lost{max-width:1100px;font-size:12px}
"""


def _esc(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _colors(names: Sequence[str]) -> dict[str, str]:
    return dict(zip(names, itertools.cycle(_PALETTE)))


def _nice_ticks(top: float, count: int = 5) -> list[float]:
    if top <= 0:
        return [0.0]
    raw = top / count
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    return [i * step for i in range(int(top / step) + 1) if i * step <= top * 1.0001]


def _fmt_tokens(v: float) -> str:
    return f"{v / 1000:.0f}k" if v >= 1000 else f"{v:.0f}"


def line_chart(
    series: dict[str, Sequence[float]], *, title: str, colors: dict[str, str],
    y_format: Callable[[float], str] = _fmt_tokens, y_max: float | None = None,
    hlines: Sequence[tuple[float, str]] = (), vlines: Sequence[tuple[float, str]] = (),
    width: int = 1100, height: int = 260,
) -> str:
    """An SVG line chart: one polyline per series over x = 0..n-1 (calls)."""
    left, right, top, bottom = 64, 16, 28, 34
    pw, ph = width - left - right, height - top - bottom
    n = max((len(v) for v in series.values()), default=0)
    peak = max([max(v, default=0) for v in series.values()] + [h for h, _ in hlines] + [0])
    ymax = y_max if y_max is not None else (peak * 1.05 or 1.0)

    def x(i: float) -> float:
        return left + (pw * i / max(n - 1, 1))

    def y(v: float) -> float:
        return top + ph - ph * min(v, ymax) / ymax

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" role="img" aria-label="{_esc(title)}">',
           f'<text x="{left}" y="16" font-size="13" font-weight="600">{_esc(title)}</text>']
    for t in _nice_ticks(ymax):
        out.append(f'<line x1="{left}" x2="{left + pw}" y1="{y(t):.1f}" y2="{y(t):.1f}" '
                   f'stroke="#eee"/><text x="{left - 6}" y="{y(t) + 4:.1f}" font-size="11" '
                   f'text-anchor="end" fill="#555">{_esc(y_format(t))}</text>')
    for t in _nice_ticks(max(n - 1, 1), 10):
        if t == int(t) and t <= n - 1:
            out.append(f'<text x="{x(t):.1f}" y="{top + ph + 16}" font-size="11" '
                       f'text-anchor="middle" fill="#555">{int(t)}</text>')
    out.append(f'<text x="{left + pw / 2}" y="{height - 2}" font-size="11" '
               'text-anchor="middle" fill="#555">model call</text>')
    out.append(f'<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="none" '
               'stroke="#ccc"/>')
    for value, label in hlines:
        out.append(f'<line x1="{left}" x2="{left + pw}" y1="{y(value):.1f}" y2="{y(value):.1f}" '
                   f'stroke="#999" stroke-dasharray="5,4"><title>{_esc(label)}</title></line>'
                   f'<text x="{left + pw - 4}" y="{y(value) - 4:.1f}" font-size="11" '
                   f'text-anchor="end" fill="#777">{_esc(label)}</text>')
    for at, label in vlines:
        out.append(f'<line x1="{x(at):.1f}" x2="{x(at):.1f}" y1="{top}" y2="{top + ph}" '
                   f'stroke="#bbb" stroke-width="3" opacity="0.6"><title>{_esc(label)}</title>'
                   '</line>')
    for name, values in series.items():
        if not values:
            continue
        points = " ".join(f"{x(i):.1f},{y(v):.1f}" for i, v in enumerate(values))
        out.append(f'<polyline fill="none" stroke="{colors.get(name, "#000")}" '
                   f'stroke-width="1.6" points="{points}"><title>{_esc(name)}</title>'
                   '</polyline>')
    out.append("</svg>")
    return "".join(out)


def _legend(names: Sequence[str], colors: dict[str, str]) -> str:
    return "<div>" + " &nbsp; ".join(
        f'<span><span class="swatch" style="background:{colors[n]}"></span>{_esc(n)}</span>'
        for n in names) + "</div>"


def _pct(v: float | None) -> str:
    return "–" if v is None else f"{v:.1%}"


def _totals_table(report: ReplayReport) -> str:
    totals = report.totals()
    base = totals.get("none", {}).get("cost_usd")
    head = ("<tr><th>strategy</th><th>calls</th><th>compactions</th><th>peak context</th>"
            "<th>input tokens</th><th>cached share</th><th>input cost</th><th>vs none</th>"
            "<th>ms / call</th><th>needed-context recall</th><th>errors</th></tr>")
    rows = []
    for name, t in totals.items():
        ratio = f"{t['cost_usd'] / base:.2f}×" if base else "–"
        rows.append(
            f"<tr><td>{_esc(name)}</td><td>{t['calls']:,}</td><td>{t['compactions']:,}</td>"
            f"<td>{t['peak_tokens']:,}</td><td>{t['total_input_tokens']:,}</td>"
            f"<td>{_pct(t['cached_share'])}</td><td>${t['cost_usd']:,.2f}</td><td>{ratio}</td>"
            f"<td>{t['ms_per_call']:.2f}</td><td>{_pct(t['recall'])} "
            f"<span class='muted'>({t['present_items']:,}/{t['needed_items']:,})</span></td>"
            f"<td>{t['errors']}</td></tr>")
    skipped = "".join(f"<tr><td>{_esc(n)}</td><td colspan='10' style='text-align:left'>"
                      f"skipped: {_esc(r)}</td></tr>" for n, r in report.skipped.items())
    return f"<table>{head}{''.join(rows)}{skipped}</table>"


def _recall_by_kind(report: ReplayReport) -> str:
    totals = report.totals()
    kinds = sorted({k for t in totals.values() for k in t["recall_by_kind"]})
    if not kinds:
        return ""
    head = "<tr><th>strategy</th>" + "".join(f"<th>{_esc(k)}</th>" for k in kinds) + "</tr>"
    rows = []
    for name, t in totals.items():
        for label, key in (("in context", "recall_by_kind"),
                           ("+ one expand away", "recall_by_kind_with_expand")):
            by_kind = t.get(key) or {}
            if key != "recall_by_kind" and not by_kind:
                continue
            cells = []
            for k in kinds:
                c = by_kind.get(k)
                cells.append(f"<td>{_pct(c['recall']) if c else '–'}</td>")
            rules = (t.get("user_rules") or {}).get("survival") if key == "recall_by_kind" \
                else None
            cells.append(f"<td>{_pct(rules)}</td>")
            rows.append(f"<tr><td>{_esc(name)} <span class='muted'>{label}</span></td>"
                        f"{''.join(cells)}</tr>")
    head = head.replace("</tr>", "<th>user rules</th></tr>")
    return (f"<h3>Recall by kind of item (user rules: rule-like user messages still held "
            f"verbatim)</h3><table>{head}{''.join(rows)}</table>")


def _cumulative(values: Sequence[float]) -> list[float]:
    return list(itertools.accumulate(values))


def _share(run: StrategyRun) -> list[float]:
    return [c / t if t else 0.0 for c, t in zip(run.cached, run.tokens)]


def _session(t: TrajectoryReplay, report: ReplayReport, colors: dict[str, str]) -> str:
    names = list(t.runs)
    calls = {at: i for i, at in enumerate(t.calls)}
    vlines = [(next((i for a, i in calls.items() if a >= idx), len(t.calls) - 1),
               f"the harness compacted here (message {idx})") for idx in t.harness_compactions]
    parts = [f"<h2>{_esc(t.source)}</h2><p class='muted'>{_esc(t.format)} · {_esc(t.dialect)} · "
             f"{t.messages:,} messages · {len(t.calls):,} model calls · full history "
             f"{t.history_tokens:,} tokens</p>", _legend(names, colors)]
    parts.append(line_chart({n: r.tokens for n, r in t.runs.items()}, colors=colors,
                            title="Context sent per call (tokens)",
                            hlines=[(report.trigger, f"trigger {report.trigger:,}")],
                            vlines=vlines))
    parts.append(line_chart({n: _cumulative(r.cost) for n, r in t.runs.items()}, colors=colors,
                            title=f"Cumulative input cost ({report.price.model}, with caching)",
                            y_format=lambda v: f"${v:.2f}"))
    parts.append(line_chart({n: _share(r) for n, r in t.runs.items()}, colors=colors,
                            title="Cached-prefix share of each call", y_max=1.0,
                            y_format=lambda v: f"{v:.0%}", height=200))
    parts.append(_records(t))
    return "".join(parts)


def _records(t: TrajectoryReplay) -> str:
    out = []
    for name, run in t.runs.items():
        if not run.compactions and not run.errors:
            continue
        rows = []
        for c in run.compactions:
            by_action: dict[str, list[int]] = {}
            for d in c.dropped:
                slot = by_action.setdefault(d["action"], [0, 0])
                slot[0] += 1
                slot[1] += d["tokens"]
            what = ", ".join(f"{a}: {n} msgs / {tok:,} tok" for a, (n, tok) in by_action.items())
            lost = ", ".join(f"<code>{_esc(i)}</code>" for i, _ in c.lost_items[:40])
            more = f" … +{c.lost_count - 40}" if c.lost_count > 40 else ""
            rows.append(f"<tr><td>{c.call}</td><td>{c.tokens_before:,} → {c.tokens_after:,}"
                        f"</td><td style='text-align:left'>{_esc(what) or '–'}</td>"
                        f"<td>{c.lost_count}</td><td class='lost' style='text-align:left'>"
                        f"{lost}{more}</td></tr>")
        errors = "".join(f"<li>{_esc(e)}</li>" for e in run.errors[:20])
        out.append(
            f"<details><summary>{_esc(name)}: {len(run.compactions)} compactions"
            f"{f', {len(run.errors)} errors' if run.errors else ''}</summary>"
            "<table><tr><th>call</th><th>tokens</th><th>messages dropped / rendered / "
            "truncated</th><th>salient items lost</th><th>items</th></tr>"
            f"{''.join(rows)}</table>{f'<ul>{errors}</ul>' if errors else ''}</details>")
    return f"<h3>Compaction record</h3>{''.join(out)}" if out else ""


def render_html(report: ReplayReport, max_sessions: int = MAX_SESSIONS) -> str:
    """The report as an HTML document (a string)."""
    colors = _colors(report.strategies)
    p = report.price
    sessions = sorted(report.trajectories, key=lambda t: -t.history_tokens)[:max_sessions]
    rest = len(report.trajectories) - len(sessions)  # drawn: the largest sessions
    failures = "".join(f"<li><code>{_esc(s)}</code>: {_esc(e)}</li>"
                       for s, e in report.failures.items())
    body = [
        "<h1>agentcompact replay</h1>",
        f"<p class='muted'>{len(report.trajectories)} sessions · trigger "
        f"{report.trigger:,} · target {report.target:,} tokens · counter {_esc(report.counter)}"
        f" · prices {_esc(p.model)} ({_esc(p.provider)}: input ${p.input}/MTok, cache read "
        f"${p.cache_read}, cache write ${p.cache_write}) · replayed in "
        f"{report.elapsed_s:.1f} s · {_dt.datetime.now().strftime('%Y-%m-%d %H:%M')}</p>",
        _totals_table(report), _recall_by_kind(report),
        f"<h3>Sessions that failed</h3><ul>{failures}</ul>" if failures else "",
        *(_session(t, report, colors) for t in sessions),
        f"<p class='muted'>{rest} more sessions are in the totals only.</p>" if rest > 0 else "",
    ]
    return ("<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
            "<title>agentcompact replay</title>"
            f"<style>{_CSS}</style></head><body>{''.join(body)}</body></html>")


def write_html(report: ReplayReport, path: str | Path, max_sessions: int = MAX_SESSIONS) -> None:
    """Write the HTML report to ``path``."""
    Path(path).write_text(render_html(report, max_sessions), encoding="utf-8")
