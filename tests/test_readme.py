"""The README's Python code blocks run as written, on a small run made for them."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BLOCK = re.compile(r"^```python\n(.*?)^```", re.MULTILINE | re.DOTALL)


def python_blocks(text: str) -> list[str]:
    """The bodies of the fenced ```python blocks of a Markdown text, in order."""
    return BLOCK.findall(text)


def test_blocks_are_found():
    blocks = python_blocks((ROOT / "README.md").read_text())
    assert len(blocks) >= 2
    assert any("import myriad" in b for b in blocks)


@pytest.mark.parametrize("index", range(len(python_blocks((ROOT / "README.md").read_text()))))
def test_readme_python_block_runs(index, tiny_pretrain, tmp_path):
    """Each block in a fresh interpreter, in a folder holding ``runs/pretrain/<run>`` (a copy
    of the tiny pretraining run); the placeholder ``<run>`` is the only change to the text."""
    code = python_blocks((ROOT / "README.md").read_text())[index]
    shutil.copytree(tiny_pretrain.path, tmp_path / "runs" / "pretrain" / "tiny")
    code = code.replace("runs/pretrain/<run>", "runs/pretrain/tiny")
    assert "<run>" not in code, "a placeholder the test does not fill"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, f"README block {index} failed:\n{code}\n{done.stderr}"


def test_import_myriad_is_cheap_and_reaches_subpackages():
    code = (
        "import sys, myriad; assert 'torch' not in sys.modules; "
        "assert callable(myriad.pretrain.pretrain) and callable(myriad.datasets.load); "
        "assert 'envs' in dir(myriad); print(myriad.__version__)"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    import myriad

    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        myriad.nothing


def test_license_changelog_citation():
    license_text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in license_text and "Version 2.0, January 2004" in license_text
    assert "END OF TERMS AND CONDITIONS" in license_text
    pyproject = (ROOT / "pyproject.toml").read_text()
    version = re.search(r'^version = "([^"]+)"', pyproject, re.MULTILINE).group(1)
    assert f"## [{version}]" in (ROOT / "CHANGELOG.md").read_text()
    import yaml

    citation = yaml.safe_load((ROOT / "CITATION.cff").read_text())
    assert citation["cff-version"] == "1.2.0"
    assert citation["version"] == version
    assert citation["license"] == "Apache-2.0"
    assert 'license = { text = "Apache-2.0" }' in pyproject
