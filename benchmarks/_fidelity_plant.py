"""The fidelity benchmark's data: real sessions, their halves, and the canaries planted in them.

**Sessions.** Every real session under ``../shared/data/trajectories`` that makes tool
calls (Claude Code main and subagent sessions, mini-swe-agent, SWE-agent function-calling
runs, tau-bench), in four families. **Halves**: within each family the sessions are put
in groups (a Claude Code session with its subagents; the four trials of a tau-bench task;
otherwise one file), the groups are ordered by a digest of their name, and alternate
groups go to the *tuning* and the *held-out* half: deterministic, and the same for every
seed. **Runs**: each session long enough to compact at the smallest trigger, and per
family and half the concatenation of all its sessions (500k-1M tokens where the family
has them: later sessions' system prompts dropped, tool-call ids made unique, a segment's
unanswered last calls removed).

**Canaries.** Each run gets many at once (about one per 4k tokens, 12 to 60), each at a
random token depth, at the start, middle or end of its carrier, in every carrier kind:
tool results held as a string or as blocks, any tool's arguments (its longest string
field), assistant text, thinking, and user text typed beside tool results (0-8 rule-like
user messages per run); plus a safety rule in the first user message. Kinds: ``path``,
``command``, ``number``, ``error`` (an error line), ``decision``, ``rule``, ``safety``.
"""

from __future__ import annotations

import copy
import itertools
import json
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import xxhash

from agentcompact import get_dialect
from agentcompact.trajectory import load

__all__ = ["CARRIERS", "KINDS", "Canary", "Run", "Source", "plant", "runs", "sources"]

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "trajectories"
KINDS = ("path", "command", "number", "error", "decision", "rule", "safety")
CARRIERS = ("result_str", "result_block", "args", "assistant", "thinking", "user_text",
            "first_user")
_KINDS_OF = {"result_str": ("path", "number", "error"), "result_block": ("path", "number", "error"),
             "args": ("command", "path"), "assistant": ("decision", "path", "command"),
             "thinking": ("decision", "path")}
WHERE = ("start", "middle", "end")
HALVES = ("tuning", "held-out")


@dataclass(frozen=True)
class Source:
    """One real session."""

    key: str  # path under the data folder, ``#n`` for a run of a multi-run file
    family: str
    group: str  # the unit the halves are split by
    dialect: str
    messages: list[Any]
    system: str | None


@dataclass(frozen=True)
class Run:
    """What one replay sends through both engines: a session, or a concatenation."""

    key: str
    family: str
    half: str
    dialect: str
    messages: list[Any]
    system: str | None
    sessions: int  # how many real sessions it holds


@dataclass
class Canary:
    kind: str
    carrier: str
    where: str
    text: str
    depth: float  # token depth of its carrier in the run (0 = first token)
    message: Any = None  # the carrier message (its index is found after planting)
    index: int = -1


def _family(rel: str) -> str | None:
    for prefix, family in (("claude-code/", "claude-code"), ("mini-swe-agent", "mini-swe-agent"),
                           ("swe-agent/", "swe-agent"), ("tau-bench/", "tau-bench")):
        if rel.startswith(prefix):
            return family
    return None


def _group(rel: str, family: str, task: str | None) -> str:
    if family == "claude-code":  # a main session with its subagents
        name = rel.split("/")[1]
        return name.split(".")[0] if "-" in name else name
    if family == "tau-bench":
        return f"tau-bench task {task}"
    if family == "mini-swe-agent":  # the task (instance): its runs in one half
        return Path(rel).name.split(".")[0]
    return rel


def sources(data: Path = DATA) -> list[Source]:
    """Every session with tool calls, ordered by key."""
    out = []
    for path in sorted(p for p in data.rglob("*") if p.is_file()):
        rel = str(path.relative_to(data))
        family = _family(rel)
        if family is None or "acompact" in rel:
            continue
        try:
            trajs = load(path)
        except Exception:  # formats the loaders skip (OpenHands event streams)
            continue
        for n, traj in enumerate(trajs):
            dialect = get_dialect(traj.dialect)
            if not any(dialect.tool_call_ids(m) for m in traj.messages):
                continue
            key = f"{rel}#{n}" if len(trajs) > 1 else rel
            out.append(Source(key, family, _group(rel, family, traj.task_id), traj.dialect,
                              traj.messages, traj.system))
    return out


def halves(found: list[Source]) -> dict[str, str]:
    """group -> half: per family, groups ordered by digest, alternating."""
    out: dict[str, str] = {}
    for family in sorted({s.family for s in found}):
        groups = sorted({s.group for s in found if s.family == family},
                        key=lambda g: xxhash.xxh3_64_hexdigest(g.encode()))
        for k, group in enumerate(groups):
            out[group] = HALVES[k % 2]
    return out


def runs(found: list[Source], tokens: Callable[[str, list[Any]], int], min_tokens: int
         ) -> list[Run]:
    """The runs: each session of at least ``min_tokens``, and per family and half the
    concatenation of its sessions (when there are several and they reach ``min_tokens``)."""
    half_of = halves(found)
    out = []
    for s in found:
        if tokens(s.dialect, s.messages) >= min_tokens:
            out.append(Run(s.key, s.family, half_of[s.group], s.dialect, s.messages, s.system,
                           1))
    for family in sorted({s.family for s in found}):
        for half in HALVES:
            members = sorted((s for s in found if s.family == family and half_of[s.group] == half),
                             key=lambda s: xxhash.xxh3_64_hexdigest(s.key.encode()))
            if len(members) < 2:
                continue
            messages = concatenate(members)
            if tokens(members[0].dialect, messages) >= min_tokens:
                out.append(Run(f"{family} {half} concatenation", family, half,
                               members[0].dialect, messages, members[0].system, len(members)))
    return out


def concatenate(members: list[Source]) -> list[Any]:
    """The sessions one after the other, as one long session."""
    out: list[Any] = []
    for k, s in enumerate(members):
        segment = [_renamed(m, s.dialect, f"s{k}_") for m in s.messages
                   if not (out and m.get("role") in ("system", "developer"))]
        segment = _answered(segment, s.dialect)
        if out and segment and out[-1].get("role") == segment[0].get("role") == "user":
            out[-1] = {**out[-1], "content": _blocks(out[-1]) + _blocks(segment[0])}
            segment = segment[1:]
        out += segment
    return out


def _blocks(message: dict[str, Any]) -> list[Any]:
    content = message.get("content")
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return list(content) if isinstance(content, list) else []


def _renamed(message: dict[str, Any], dialect: str, prefix: str) -> dict[str, Any]:
    """``message`` with its tool-call ids prefixed (unique across concatenated sessions)."""
    m = dict(message)
    if dialect == "openai_chat":
        if m.get("tool_calls"):
            m["tool_calls"] = [{**tc, "id": prefix + str(tc.get("id"))} for tc in m["tool_calls"]]
        if m.get("tool_call_id"):
            m["tool_call_id"] = prefix + str(m["tool_call_id"])
        return m
    if isinstance(m.get("content"), list):
        blocks = []
        for b in m["content"]:
            if isinstance(b, dict) and b.get("type") == "tool_use":
                b = {**b, "id": prefix + str(b.get("id"))}
            elif isinstance(b, dict) and b.get("type") == "tool_result":
                b = {**b, "tool_use_id": prefix + str(b.get("tool_use_id"))}
            blocks.append(b)
        m["content"] = blocks
    return m


def _answered(segment: list[Any], dialect: str) -> list[Any]:
    """``segment`` without tool calls its messages never answer (a run's last submit)."""
    d = get_dialect(dialect)
    answered = {ref for m in segment for ref in d.tool_result_ids(m)}
    out = []
    for m in segment:
        calls = d.tool_call_ids(m)
        if calls and not set(calls) <= answered:
            if dialect == "openai_chat":
                m = {k: v for k, v in m.items() if k != "tool_calls"}
                if not m.get("content"):
                    continue
            else:
                blocks = [b for b in _blocks(m) if not (isinstance(b, dict) and b.get(
                    "type") == "tool_use" and b.get("id") not in answered)]
                if not blocks:
                    continue
                m = {**m, "content": blocks}
        out.append(m)
    return out


# --- canaries ----------------------------------------------------------------------------
def canary_text(kind: str, tag: str, rng: random.Random) -> str:
    n = rng.randint(100, 9999)
    choices = {
        "path": (f"/srv/{tag}/config/settings_{tag}.yaml", f"src/{tag}/handlers/{tag}_view.py",
                 f"tests/integration/test_{tag}_orders.py"),
        "command": (f"python -m scripts.migrate_{tag} --dry-run",
                    f"make deploy-{tag} ENV=staging", f"kubectl rollout restart deploy/{tag}-api"),
        "number": (f"{tag}.p99_latency_ms = {n}", f"checksum_{tag}: {n * 7919}",
                   f"rows_migrated_{tag}={n}"),
        "error": (f"E   AssertionError: expected {n} rows in orders_{tag}, got {n - 1}",
                  f"ConnectionRefusedError: [Errno 111] Connection refused: {tag}.internal:{n}",
                  f"FAILED tests/test_{tag}.py::test_refund - KeyError: '{tag}_id'"),
        "decision": (f"Decision: we keep the adapter pattern for payments_{tag} instead of "
                     "subclassing.", f"Decision: retry_{tag} stays at 3 attempts; backoff is "
                     "exponential.", f"I will store sessions_{tag} in Redis, not in Postgres."),
        "rule": (f"From now on do not edit anything under legacy_{tag}/.",
                 f"Never run the migrations against db_{tag} without asking me first.",
                 f"You must keep every function in {tag}.py under {n % 60 + 20} lines.",
                 f"Always run make lint-{tag} before you commit."),
        "safety": (f"Safety rule: never run git push --force on the branch release-{tag}.",),
    }[kind]
    return rng.choice(choices)


def _insert(text: str, canary: str, where: str, sep: str = "\n") -> str:
    if where == "start" or not text:
        return f"{canary}{sep}{text}" if text else canary
    if where == "end":
        return f"{text}{sep}{canary}"
    mid = len(text) // 2
    k = text.rfind(sep, 0, mid) + 1 or text.find(sep, mid) + 1
    if k <= 0:
        k = mid
    return f"{text[:k]}{canary}{sep}{text[k:]}"


_Slot = tuple[int, str, Callable[[str, str], None]]  # (message index, carrier, plant)


def _slots(messages: list[Any], dialect: str) -> Iterator[_Slot]:
    """Every place a canary can go: (message index, carrier kind, plant(text, where))."""
    for i, m in enumerate(messages):
        if dialect == "anthropic":
            yield from _anthropic_slots(i, m)
        else:
            yield from _chat_slots(i, m)


def _anthropic_slots(i: int, m: dict[str, Any]) -> Iterator[_Slot]:
    content = m.get("content")
    if not isinstance(content, list):
        return
    role = m.get("role")
    for b in content:
        if not isinstance(b, dict):
            continue
        kind = b.get("type")
        if role == "user" and kind == "tool_result":
            yield i, "result_str", _result_setter(b, block=False)
            yield i, "result_block", _result_setter(b, block=True)
        elif role == "assistant" and kind == "text" and b.get("text"):
            yield i, "assistant", _field_setter(b, "text", "\n\n")
        elif role == "assistant" and kind == "thinking" and b.get("thinking"):
            yield i, "thinking", _field_setter(b, "thinking", "\n\n")
        elif role == "assistant" and kind == "tool_use" and isinstance(b.get("input"), dict):
            if _longest(b["input"]) is not None:
                yield i, "args", _args_setter(b, "input", parsed=True)
    if role == "user" and any(isinstance(b, dict) and b.get("type") == "tool_result"
                              for b in content):
        yield i, "user_text", lambda text, where: content.append({"type": "text", "text": text})


def _chat_slots(i: int, m: dict[str, Any]) -> Iterator[_Slot]:
    role = m.get("role")
    if role == "tool":
        yield i, "result_str", _result_setter(m, block=False)
        yield i, "result_block", _result_setter(m, block=True)
    elif role == "assistant":
        if isinstance(m.get("content"), str) and m["content"]:
            yield i, "assistant", _field_setter(m, "content", "\n\n")
        if isinstance(m.get("reasoning_content"), str) and m["reasoning_content"]:
            yield i, "thinking", _field_setter(m, "reasoning_content", "\n\n")
        for tc in m.get("tool_calls") or ():
            fn = tc.get("function") or {}
            try:
                args = json.loads(fn.get("arguments") or "")
            except ValueError:
                continue
            if isinstance(args, dict) and _longest(args) is not None:
                yield i, "args", _args_setter(fn, "arguments", parsed=False)
        if m.get("tool_calls"):  # user text after its results: inserted by ``plant``
            yield i, "user_text", lambda text, where: None


def _result_setter(holder: dict[str, Any], block: bool) -> Callable[[str, str], None]:
    def plant(canary: str, where: str) -> None:
        content = holder.get("content")
        if isinstance(content, list):
            texts = [b for b in content if isinstance(b, dict) and b.get("type") == "text"]
            if block and texts:
                b = texts[-1] if where == "end" else texts[0] if where == "start" else \
                    texts[len(texts) // 2]
                b["text"] = _insert(b.get("text", ""), canary, where)
                return
            content = "\n".join(b.get("text", "") for b in texts)
        text = _insert(content if isinstance(content, str) else "", canary, where)
        holder["content"] = [{"type": "text", "text": text}] if block else text
    return plant


def _field_setter(holder: dict[str, Any], key: str, sep: str) -> Callable[[str, str], None]:
    def plant(canary: str, where: str) -> None:
        holder[key] = _insert(holder[key], canary, where, sep)
    return plant


def _longest(args: dict[str, Any]) -> str | None:
    names = [k for k, v in args.items() if isinstance(v, str) and v]
    return max(names, key=lambda k: len(args[k])) if names else None


def _args_setter(holder: dict[str, Any], key: str, parsed: bool) -> Callable[[str, str], None]:
    def plant(canary: str, where: str) -> None:
        args = holder[key] if parsed else json.loads(holder[key])
        args = dict(args)
        name = _longest(args)
        assert name is not None
        sep = " && " if name in ("command", "cmd") else " "
        args[name] = _insert(args[name], canary, where, sep if "\n" not in args[name] else "\n")
        holder[key] = args if parsed else json.dumps(args)
    return plant


def plant(run: Run, seed: int, tokens: list[int], end: int) -> tuple[list[Any], list[Canary]]:
    """A copy of ``run.messages`` with its canaries (``tokens``: each message's tokens),
    in carriers before message ``end`` (the replay's last call sends ``messages[:end]``)."""
    rng = random.Random(f"{seed}:{run.key}")
    messages = copy.deepcopy(run.messages)
    prefix = [0]
    for t in tokens:
        prefix.append(prefix[-1] + t)
    total = prefix[-1] or 1
    slots: dict[str, list[_Slot]] = {}
    for slot in _slots(messages, run.dialect):
        if slot[0] < end:
            slots.setdefault(slot[1], []).append(slot)
    canaries: list[Canary] = []
    used: set[tuple[int, str]] = set()
    tags = (xxhash.xxh3_64_hexdigest(f"{seed}:{run.key}:{k}".encode())[:6]
            for k in itertools.count())
    n = min(60, max(12, total // 4000))
    general = [c for c in _KINDS_OF if slots.get(c)]
    for _ in range(n):
        carrier = rng.choice(general)
        canaries.append(_place(rng, slots[carrier], carrier, rng.choice(_KINDS_OF[carrier]),
                               next(tags), prefix, total, used))
    if slots.get("user_text"):
        for _ in range(rng.randint(0, 8)):
            canaries.append(_place(rng, slots["user_text"], "user_text", "rule", next(tags),
                                   prefix, total, used))
    first = next((m for m in messages if m.get("role") == "user"), None)
    if first is not None:
        text = canary_text("safety", next(tags), rng)
        first["content"] = (f"{first['content']}\n\n{text}" if isinstance(first["content"], str)
                            else [*first["content"], {"type": "text", "text": text}])
        canaries.append(Canary("safety", "first_user", "end", text, 0.0, first))
    messages = _insert_user_text(messages, canaries, run.dialect)
    position = {id(m): i for i, m in enumerate(messages)}
    for c in canaries:
        c.index = position[id(c.message)]
    return messages, canaries


def _place(rng: random.Random, slots: list[_Slot], carrier: str, kind: str, tag: str,
           prefix: list[int], total: int, used: set[tuple[int, str]]) -> Canary:
    at = rng.random() * total
    order = sorted(range(len(slots)), key=lambda k: abs(prefix[slots[k][0]] - at))
    pick = next((k for k in order if (slots[k][0], carrier) not in used), order[0])
    i, _, put = slots[pick]
    used.add((i, carrier))
    where = "end" if carrier == "user_text" else rng.choice(WHERE)  # typed after the results
    text = canary_text(kind, tag, rng)
    put(text, where)
    return Canary(kind, carrier, where, text, prefix[i] / total, None, i)


def _insert_user_text(messages: list[Any], canaries: list[Canary], dialect: str) -> list[Any]:
    """Resolve each canary's carrier message; for chat, a rule typed beside the results of
    an assistant's calls is a user message after those results."""
    after: dict[int, list[str]] = {}
    for c in canaries:
        if c.message is not None:
            continue
        if dialect == "openai_chat" and c.carrier == "user_text":
            after.setdefault(c.index, []).append(c.text)
        else:
            c.message = messages[c.index]
    if not after:
        return messages
    out: list[Any] = []
    made: dict[str, Any] = {}
    pending: list[tuple[int, list[str]]] = []
    for i, m in enumerate(messages):
        if pending and m.get("role") != "tool":
            for _, texts in pending:
                for text in texts:
                    made[text] = {"role": "user", "content": text}
                    out.append(made[text])
            pending = []
        out.append(m)
        if i in after:
            pending.append((i, after[i]))
    for _, texts in pending:
        for text in texts:
            made[text] = {"role": "user", "content": text}
            out.append(made[text])
    for c in canaries:
        if c.message is None:
            c.message = made[c.text]
    return out
