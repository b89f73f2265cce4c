"""Rename agentcompact's implementation modules to private ``_x.py`` and rewrite every
reference to them; idempotent, so it can run again on a tree where other branches merged.

Usage (from the repository root)::

    python tools/privatize.py            # apply: git mv, then rewrite references
    python tools/privatize.py --check    # change nothing; list what would move or be rewritten
    python tools/privatize.py --report   # the public surface: public/private modules, __all__ sizes

What it does:

1. ``git mv`` every file of ``RENAMES`` that is still at its old path (a folder rule also
   moves any other ``.py`` file merged into the old folder since, under the same name).
2. Rewrites, in ``SCAN`` (package, tests, benchmarks, docs, README, pyproject, tox.ini,
   .ci/run): dotted module paths (``agentcompact.integrations.proxy.app`` ->
   ``agentcompact.integrations.proxy._app``, also inside strings: ``mock.patch`` targets,
   entry points, ``python -m``), relative imports inside the package (``from .engine import``,
   ``from ..proxy.wire import``; in a moved folder, imports that leave it are resolved from
   its old place and written absolute), submodules imported by name (``from . import
   hookspecs`` -> ``from . import _hookspecs as hookspecs``) and file paths
   (``integrations/proxy/app.py``). Outside the package (tests, benchmarks, docs, README) a
   ``from <private module> import names`` whose names the public parent package exports is
   written ``from <public package> import names``; in docs, a private dotted path in prose
   becomes the public name (``agentcompact.rl._schema.read_rows`` -> ``agentcompact.rl.read_rows``)
   or, for a bare module, its source file (``agentcompact._events`` -> ``core/_events.py``).
3. Re-sorts the imports of the rewritten files (``ruff check --fix --select I``; run it with
   an interpreter that has ruff).
Lines containing ``privatize: keep`` are never rewritten.

4. Prints each line it could not rewrite safely (``from agentcompact.integrations import
   upstream_sim``-style imports of a moved folder) for a hand fix.
"""

from __future__ import annotations

import argparse
import ast
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

#: source folder -> package, as [tool.setuptools.package-dir] in pyproject.toml
PACKAGE_DIRS = {"core": "agentcompact", "plugins": "agentcompact.plugins",
                "integrations": "agentcompact.integrations"}

#: old file (or folder, ending in "/") -> new one. Modules not listed stay public.
RENAMES: dict[str, str] = {
    # agentcompact
    **{f"core/{m}.py": f"core/_{m}.py" for m in (
        "archive", "background", "budget", "cachecost", "cli", "demo", "engine", "events",
        "expand", "hookspecs", "logging_hooks", "markers", "pluginmanager", "pytest_plugin",
        "redact", "settings", "store", "summarizer", "tokens", "turns")},
    **{f"core/dialects/{m}.py": f"core/dialects/_{m}.py" for m in (
        "anthropic", "base", "builtin", "objects", "openai_chat", "openai_responses")},
    **{f"core/strategies/{m}.py": f"core/strategies/_{m}.py" for m in (
        "base", "builtin", "cliff", "parallel", "summary")},
    **{f"core/stores/{m}.py": f"core/stores/_{m}.py" for m in (
        "codec", "redis_store", "shared", "sqlite_store")},
    # trajectory: export and ray_export stay public (they need the export / ray extras,
    # so the package cannot re-export them without importing pyarrow / numpy)
    **{f"core/trajectory/{m}.py": f"core/trajectory/_{m}.py" for m in (
        "events_log", "export_cli", "importers", "loaders", "sampled", "segments",
        "tokenize")},
    # rl: the torch modules (adapters, logprobs, ppo, recompute, torch_data, trl) stay
    # public, so ``import agentcompact.rl`` works without torch
    **{f"core/rl/{m}.py": f"core/rl/_{m}.py" for m in (
        "advantages", "card", "gae", "loss", "schema")},
    **{f"core/replay/{m}.py": f"core/replay/_{m}.py" for m in (
        "baselines", "cli", "codex", "pricing", "recall", "replay", "report")},
    # integrations: langgraph, llamaindex, sdk, expand_tools stay public (entry modules)
    "integrations/mcp_server.py": "integrations/_mcp_server.py",
    "integrations/threaded_server.py": "integrations/_threaded_server.py",
    **{f"integrations/proxy/{m}.py": f"integrations/proxy/_{m}.py" for m in (
        "app", "bodies", "cli", "config", "h1", "launch", "observe", "reassemble", "relay",
        "speculation", "upstream", "watch", "wire")},
    # the upstream simulator, a test tool: agentcompact.testing
    "integrations/upstream_sim/": "core/testing/",
    **{f"integrations/upstream_sim/{m}.py": f"core/testing/_{m}.py" for m in (
        "anthropic_wire", "app", "clis", "completion", "latency", "openai_wire",
        "responses_wire", "runner", "script")},
}

#: where references are rewritten (folders recursively: .py .md .toml .ini .txt .cfg .yml)
SCAN = ["core", "plugins", "integrations", "tests", "benchmarks", "docs", "tools", "README.md",
        "pyproject.toml", "tox.ini", ".ci/run"]
SUFFIXES = {".py", ".md", ".toml", ".ini", ".txt", ".cfg", ".yml", ".yaml", ".sh"}
PACKAGE_ROOTS = ("core", "plugins", "integrations")
KEEP = "privatize: keep"

IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
DOTTED = re.compile(rf"(?<![\w.])agentcompact(?:\.{IDENT})+")
FROM_LINE = re.compile(rf"^(?P<indent>[ \t]*)from[ \t]+(?P<dots>\.*)(?P<mod>{IDENT}(?:\.{IDENT})*)?"
                       rf"[ \t]+import[ \t]+", re.M)


def module_of(path: str) -> str | None:
    """The dotted module a source path (file or folder/) is, or None outside the package."""
    parts = path.rstrip("/").removesuffix(".py").split("/")
    best = None
    for folder, pkg in PACKAGE_DIRS.items():
        fparts = folder.split("/")
        if parts[:len(fparts)] == fparts and (best is None or len(fparts) > best[0]):
            best = (len(fparts), pkg)
    if best is None:
        return None
    rest = parts[best[0]:]
    if rest and rest[-1] == "__init__":
        rest = rest[:-1]
    return ".".join([best[1], *rest])


def module_map() -> dict[str, str]:
    """Old dotted module -> new one (folders: the package itself)."""
    out: dict[str, str] = {}
    for old, new in RENAMES.items():
        a, b = module_of(old), module_of(new)
        if a and b and a != b:
            out[a] = b
    return out


MODULES = module_map()
#: old package (a moved folder) -> new one
MOVED_PACKAGES = {module_of(o): module_of(n) for o, n in RENAMES.items() if o.endswith("/")}


def git(*args: str) -> None:
    subprocess.run(["git", "-C", str(ROOT), *args], check=True)


def apply_renames(check: bool) -> list[str]:
    moves: list[tuple[str, str]] = []
    for old, new in RENAMES.items():
        if old.endswith("/"):
            continue
        if (ROOT / old).exists() and not (ROOT / new).exists():
            moves.append((old, new))
    for old, new in RENAMES.items():  # folders: whatever else is (or was merged) there
        if not old.endswith("/") or not (ROOT / old).is_dir():
            continue
        for f in sorted((ROOT / old).glob("*.py")):
            rel = f.relative_to(ROOT).as_posix()
            if rel not in RENAMES:
                moves.append((rel, new + f.name))
    done = []
    for old, new in moves:
        done.append(f"{old} -> {new}")
        if check:
            continue
        (ROOT / new).parent.mkdir(parents=True, exist_ok=True)
        git("mv", old, new)
    if not check:
        for old in RENAMES:
            d = ROOT / old
            if old.endswith("/") and d.is_dir():
                for cache in d.glob("__pycache__"):
                    for f in cache.iterdir():
                        f.unlink()
                    cache.rmdir()
                if not any(d.iterdir()):
                    d.rmdir()
    return done


def known_modules() -> set[str]:
    """Every module (and package) of the package as on disk now, plus the old names."""
    out = set(MODULES)
    for root in PACKAGE_ROOTS:
        for f in (ROOT / root).rglob("*.py"):
            m = module_of(f.relative_to(ROOT).as_posix())
            if m:
                out.add(m)
    return out


def package_all(package: str) -> set[str]:
    """The names a package's ``__init__`` lists in ``__all__`` (parsed, not imported)."""
    for folder, pkg in sorted(PACKAGE_DIRS.items(), key=lambda kv: -len(kv[1])):
        if package == pkg or package.startswith(pkg + "."):
            rel = package[len(pkg):].lstrip(".").replace(".", "/")
            init = ROOT / folder / rel / "__init__.py"
            break
    else:
        return set()
    if not init.exists():
        return set()
    try:
        tree = ast.parse(init.read_text())
    except SyntaxError:
        return set()
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__"
                                                for t in node.targets):
            try:
                return set(ast.literal_eval(node.value))
            except ValueError:
                return set()
    return set()


def map_module(dotted: str) -> str:
    """``dotted`` with its longest old-module prefix replaced by the new module."""
    parts = dotted.split(".")
    for n in range(len(parts), 0, -1):
        head = ".".join(parts[:n])
        if head in MODULES:
            return ".".join([MODULES[head], *parts[n:]])
    return dotted


def ambiguous(module: str) -> bool:
    """An old module whose name its parent package also exports (``agentcompact.replay.replay``
    the module vs the function): a bare dotted mention is left alone."""
    parent, _, name = module.rpartition(".")
    return name in package_all(map_module(parent))


def rewrite_dotted(text: str) -> str:
    def sub(m: re.Match[str]) -> str:
        dotted = m.group(0)
        parts = dotted.split(".")
        for n in range(len(parts), 0, -1):
            head = ".".join(parts[:n])
            if head in MODULES:
                if n == len(parts) and ambiguous(head) and not _module_context(text, m):
                    return dotted
                return ".".join([MODULES[head], *parts[n:]])
        return dotted

    return DOTTED.sub(sub, text)


def _module_context(text: str, m: re.Match[str]) -> bool:
    """The match is a module in an import statement, a ``python -m`` or a file path."""
    line_start = text.rfind("\n", 0, m.start()) + 1
    before = text[line_start:m.start()]
    return bool(re.search(r"(^|\s)(from|import)\s+$|-m\s+$", before))


def resolve_relative(pkg: str, dots: int, mod: str | None) -> str:
    base = pkg.split(".")
    if dots > 1:
        base = base[:len(base) - (dots - 1)]
    return ".".join([*base, *([mod] if mod else [])])


def relative_from(pkg: str, target: str) -> tuple[int, str]:
    """(dots, module) writing ``target`` relative to package ``pkg``."""
    a, b = pkg.split("."), target.split(".")
    common = 0
    while common < min(len(a), len(b)) and a[common] == b[common]:
        common += 1
    return len(a) - common + 1, ".".join(b[common:])


def file_package(rel: str) -> str | None:
    m = module_of(rel)
    if m is None:
        return None
    return m if rel.endswith("__init__.py") else m.rpartition(".")[0]


def old_package(rel: str) -> str | None:
    """The package a file of a moved folder was in before the move."""
    for old, new in RENAMES.items():
        if old.endswith("/") and rel.startswith(new):
            return module_of(old)
    return None


def rewrite_from_imports(text: str, rel: str, in_package: bool) -> tuple[str, list[str]]:
    """Rewrite every ``from X import ...`` statement's module and submodule names."""
    pkg = file_package(rel) if in_package else None
    was = old_package(rel) if in_package else None
    known = known_modules()
    problems: list[str] = []
    out: list[str] = []
    pos = 0
    for m in FROM_LINE.finditer(text):
        dots, mod = len(m.group("dots")), m.group("mod")
        if dots and pkg is None:
            continue
        if dots and pkg is not None:
            absolute = resolve_relative(pkg, dots, mod)
            if was is not None:  # written for the folder's old place (merged code)?
                old_abs = resolve_relative(was, dots, mod)
                if old_abs in known:
                    absolute = old_abs
        else:
            absolute = mod or ""
        if not absolute.startswith("agentcompact"):
            continue
        names_start = m.end()
        names_end = _names_end(text, names_start)
        names_text = text[names_start:names_end]
        new_abs = map_module(absolute)
        new_names, note = _rewrite_names(absolute, new_abs, names_text)
        if note:
            line = text.count("\n", 0, m.start()) + 1
            problems.append(f"{rel}:{line}: {note}")
        if not in_package:
            public = _public_parent(new_abs, names_text)
            if public:
                new_abs = public
        if dots and pkg is not None and not (was is not None and dots > 1):
            d, rest = relative_from(pkg, new_abs)
            head = f"{m.group('indent')}from {'.' * d}{rest} import "
        else:  # absolute; and, in a moved folder, what leaves the folder
            head = f"{m.group('indent')}from {new_abs} import "
        out.append(text[pos:m.start()])
        out.append(head + new_names)
        pos = names_end
    out.append(text[pos:])
    return "".join(out), problems


def _names_end(text: str, start: int) -> int:
    """Where the imported names end: the closing parenthesis, or the first end of line
    (past backslash continuations), ``;``, ``#`` or quote (an import inside a string)."""
    if text.startswith("(", start):
        return text.index(")", start) + 1
    end = start
    while end < len(text):
        ch = text[end]
        if ch == "\\" and text.startswith("\n", end + 1):
            end += 2
            continue
        if ch in "\n;#'\"":
            return end
        end += 1
    return end


def _rewrite_names(old_mod: str, new_mod: str, names_text: str) -> tuple[str, str | None]:
    """Submodules imported by name: ``from . import hookspecs`` -> ``_hookspecs as hookspecs``."""
    note = None
    exported = package_all(new_mod)

    def sub(m: re.Match[str]) -> str:
        nonlocal note
        name, alias = m.group("name"), m.group("alias")
        full = f"{old_mod}.{name}"
        if full not in MODULES or name in exported:
            return m.group(0)
        parent, _, new_name = MODULES[full].rpartition(".")
        if parent != new_mod:
            note = f"imports {full} by name, now {MODULES[full]}: fix by hand"
            return m.group(0)
        alias = alias or name
        return new_name if alias == new_name else f"{new_name} as {alias}"

    pat = re.compile(rf"(?<![\w.])(?P<name>{IDENT})(?:[ \t]+as[ \t]+(?P<alias>{IDENT}))?")
    lines = []
    for line in names_text.split("\n"):  # names only, never words of a comment
        code, hash_, comment = line.partition("#")
        lines.append(pat.sub(sub, code) + hash_ + comment)
    return "\n".join(lines), note


def _code(names_text: str) -> str:
    return "\n".join(line.partition("#")[0] for line in names_text.split("\n"))


def _public_parent(private_mod: str, names_text: str) -> str | None:
    """The nearest public package exporting every name imported from a private module."""
    names = re.findall(rf"(?<![\w.])({IDENT})(?:[ \t]+as[ \t]+{IDENT})?", _code(names_text))
    names = [n for n in names if n != "as"]
    if not names or "*" in names_text:
        return None
    parts = private_mod.split(".")
    if not any(p.startswith("_") for p in parts):
        return None
    for n in range(len(parts) - 1, 0, -1):
        pkg = ".".join(parts[:n])
        if any(p.startswith("_") for p in parts[:n]):
            continue
        exported = package_all(pkg)
        if exported and all(name in exported for name in names):
            return pkg
    return None


def path_map() -> dict[str, str]:
    """Old file path -> new, with unique shorter suffixes (``proxy/app.py``)."""
    full = dict(RENAMES)
    out = dict(full)
    out.update({o.rstrip("/"): n.rstrip("/") for o, n in full.items() if o.endswith("/")})
    suffixes: dict[str, list[tuple[str, str]]] = {}
    for old, new in full.items():
        if old.endswith("/"):
            continue
        parts = old.split("/")
        for k in range(2, len(parts)):
            suffixes.setdefault("/".join(parts[-k:]), []).append((old, new))
    for suffix, hits in suffixes.items():
        if len(hits) == 1 and suffix not in out:
            old, new = hits[0]
            # the new suffix: as many trailing parts of the new path as the old suffix had
            # folders, plus any folder the move changed
            k = suffix.count("/") + 1
            out[suffix] = "/".join(new.split("/")[-k:]) if old.rsplit("/", 1)[0] == \
                new.rsplit("/", 1)[0] else new
    return out


PATHS = path_map()
PATH_RE = re.compile(r"(?<![\w/.])(" + "|".join(
    re.escape(p) for p in sorted(PATHS, key=len, reverse=True)) + r")(?![\w])")


def publish_prose(text: str) -> str:
    """In docs: a private dotted path becomes the public name when a public package exports
    it (``agentcompact.rl._schema.read_rows`` -> ``agentcompact.rl.read_rows``), and a bare
    private module its source file (``agentcompact._events`` -> ``core/_events.py``)."""
    known = known_modules()

    def sub(m: re.Match[str]) -> str:
        dotted = m.group(0)
        parts = dotted.split(".")
        if not any(p.startswith("_") and not p.startswith("__") for p in parts[1:]):
            return dotted
        if _module_context(text, m):
            return dotted
        n = max((k for k in range(1, len(parts) + 1) if ".".join(parts[:k]) in known),
                default=0)
        if n == 0:
            return dotted
        module, tail = ".".join(parts[:n]), parts[n:]
        if tail:
            for k in range(n - 1, 0, -1):
                pkg = ".".join(parts[:k])
                if not any(p.startswith("_") for p in parts[1:k]) and tail[0] in package_all(pkg):
                    return ".".join([pkg, *tail])
            return dotted
        return source_path(module) or dotted

    return DOTTED.sub(sub, text)


def source_path(module: str) -> str | None:
    for folder, pkg in sorted(PACKAGE_DIRS.items(), key=lambda kv: -len(kv[1])):
        if module == pkg or module.startswith(pkg + "."):
            rel = module[len(pkg):].lstrip(".").replace(".", "/")
            base = f"{folder}/{rel}" if rel else folder
            if (ROOT / f"{base}.py").exists():
                return f"{base}.py"
            if (ROOT / base / "__init__.py").exists():
                return f"{base}/"
    return None


def rewrite_paths(text: str) -> str:
    return PATH_RE.sub(lambda m: PATHS[m.group(1)], text)


def scan_files() -> list[Path]:
    files: list[Path] = []
    for entry in SCAN:
        p = ROOT / entry
        if p.is_file():
            files.append(p)
        elif p.is_dir():
            files.extend(f for f in sorted(p.rglob("*"))
                         if f.is_file() and f.suffix in SUFFIXES
                         and "__pycache__" not in f.parts and ".venv" not in f.parts)
    me = Path(__file__).resolve()
    return [f for f in files if f.resolve() != me]


def rewrite_file(path: Path) -> tuple[str, str, list[str]]:
    rel = path.relative_to(ROOT).as_posix()
    text = path.read_text()
    # lines marked "privatize: keep" (e.g. a doc naming the old path on purpose) stay as
    # they are: set aside behind placeholders, put back after the rewrite
    kept = [line for line in text.split("\n") if KEEP in line]
    new = "\n".join(f"\0{KEEP}{i}\0" if KEEP in line else line
                     for i, line in enumerate(text.split("\n")))
    problems: list[str] = []
    in_package = rel.split("/")[0] in PACKAGE_ROOTS and path.suffix == ".py"
    if path.suffix in (".py", ".md"):
        new, problems = rewrite_from_imports(new, rel, in_package)
    new = rewrite_dotted(new)
    if path.suffix == ".md":
        new = publish_prose(new)
    new = rewrite_paths(new)
    marks = iter(kept)
    new = re.sub(f"\0{KEEP}\\d+\0", lambda _: next(marks), new)
    for i, line in enumerate(new.splitlines(), 1):
        for old in MOVED_PACKAGES:
            parent, _, name = old.rpartition(".")
            if re.search(rf"from\s+{re.escape(parent)}\s+import\s+.*\b{name}\b", line):
                problems.append(f"{rel}:{i}: imports the moved package {old} by name")
    return text, new, problems


def report() -> None:
    pub, priv, names = [], [], 0
    for root in PACKAGE_ROOTS:
        for f in sorted((ROOT / root).rglob("*.py")):
            rel = f.relative_to(ROOT).as_posix()
            mod = module_of(rel)
            if mod is None or mod.endswith("__main__"):
                continue
            (priv if any(p.startswith("_") for p in mod.split(".")) else pub).append(mod)
    for mod in pub:
        names += len(package_all(mod)) if _is_package(mod) else len(_module_all(mod))
    packages = sum(1 for mod in pub if _is_package(mod))
    print(f"public modules: {len(pub)} ({packages} packages)  private modules: {len(priv)}  "
          f"names in public __all__s: {names}")
    for mod in pub:
        print("  public", mod)


def _is_package(mod: str) -> bool:
    return any(mod == pkg for pkg in _packages())


def _packages() -> set[str]:
    out = set()
    for root in PACKAGE_ROOTS:
        for f in (ROOT / root).rglob("__init__.py"):
            m = module_of(f.relative_to(ROOT).as_posix())
            if m:
                out.add(m)
    return out


def _module_all(mod: str) -> set[str]:
    for folder, pkg in sorted(PACKAGE_DIRS.items(), key=lambda kv: -len(kv[1])):
        if mod.startswith(pkg + "."):
            f = ROOT / folder / (mod[len(pkg) + 1:].replace(".", "/") + ".py")
            if f.exists():
                for node in ast.parse(f.read_text()).body:
                    if isinstance(node, ast.Assign) and any(
                            getattr(t, "id", None) == "__all__" for t in node.targets):
                        return set(ast.literal_eval(node.value))
            return set()
    return set()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="change nothing, list changes")
    parser.add_argument("--report", action="store_true", help="print the public surface")
    args = parser.parse_args(argv)
    if args.report:
        report()
        return 0
    for line in apply_renames(args.check):
        print(("would move " if args.check else "moved ") + line)
    all_problems: list[str] = []
    rewritten: list[str] = []
    for path in scan_files():
        old, new, problems = rewrite_file(path)
        all_problems += problems
        if new != old:
            print(("would rewrite " if args.check else "rewrote ")
                  + path.relative_to(ROOT).as_posix())
            if not args.check:
                path.write_text(new)
                if path.suffix == ".py":
                    rewritten.append(str(path))
    if rewritten:  # renamed modules sort elsewhere: let ruff re-sort the imports it changed
        subprocess.run([sys.executable, "-m", "ruff", "check", "--quiet", "--fix",
                        "--select", "I", *rewritten], cwd=ROOT, check=False)
    for p in all_problems:
        print("FIX BY HAND:", p, file=sys.stderr)
    return 1 if all_problems else 0


if __name__ == "__main__":
    sys.exit(main())
