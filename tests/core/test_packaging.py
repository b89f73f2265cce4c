"""The built wheel holds every sub-package and imports in a fresh venv."""

from __future__ import annotations

import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MAPPING = {"core": "agentcompact", "plugins": "agentcompact/plugins",
           "integrations": "agentcompact/integrations"}


def expected_packages() -> set[str]:
    out = set()
    for folder, target in MAPPING.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / folder)
            out.add(str(Path(target) / rel) if str(rel) != "." else target)
    return out


@pytest.mark.slow
def test_wheel_contains_every_package_and_imports(tmp_path: Path) -> None:
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w",
                    str(tmp_path), str(ROOT)], check=True, timeout=600)
    wheel = next(tmp_path.glob("agentcompact-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    packaged = {str(Path(n).parent) for n in names if n.endswith("__init__.py")}
    assert expected_packages() <= packaged, expected_packages() - packaged
    assert "agentcompact/py.typed" in names
    env = tmp_path / "venv"
    venv.create(env, with_pip=True)
    python = env / "bin" / "python"
    subprocess.run([str(python), "-m", "pip", "install", "-q", str(wheel)], check=True,
                   timeout=600)
    out = subprocess.run(
        [str(python), "-c", "import agentcompact, agentcompact.plugins, "
         "agentcompact.integrations; print(agentcompact.Engine.__name__)"],
        check=True, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert out.stdout.strip() == "Engine"
