"""The README a new user reads: what they need in its first 150 lines, in plain words, and links
that lead somewhere."""

from __future__ import annotations

import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
pytestmark = pytest.mark.skipif(not README.is_file(), reason="no README beside the tests (an installed copy)")

#: The kernels' vocabulary, which a user of the API does not need.
JARGON = ("wgmma", "tma", "setmaxnreg", "pingpong", "ping-pong", "split-kv", "mma.sync", "cp.async",
          "warpgroup", "sass", "ptxas", "cubin", "persistent cta", "epilogue")


def _head() -> str:
    return "\n".join(README.read_text(encoding="utf-8").splitlines()[:150])


def test_the_first_150_lines_hold_what_a_new_user_needs():
    head = _head()
    for needed in ("pip install", "python -m cudattn demo", "pytest tests", "cudattn.attention(",
                   "cudattn.attention_with_kvcache(", "## What is supported", "## Speed", "cuDNN", "H200"):
        assert needed in head, needed


def test_the_first_150_lines_need_no_kernel_vocabulary():
    words = re.findall(r"[\w.+-]+", _head().lower())
    text = " ".join(words)
    used = [j for j in JARGON if re.search(rf"(?<![\w.]){re.escape(j)}(?![\w])", text)]
    assert not used, used


def test_the_stated_times_are_filled_in():
    head = _head()
    assert not re.search(r"\b[A-Z_]+_TIME\b", head)
    assert re.search(r"demo.*?\d+ ?(s|min)", head, re.S) and re.search(r"pytest tests.*?\d+ ?(s|min)", head, re.S)


@pytest.mark.parametrize("doc", sorted(p.name for p in ROOT.glob("*.md")) + sorted(
    f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md")))
def test_relative_links_lead_to_files(doc):
    path = ROOT / doc
    missing = []
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", path.read_text(encoding="utf-8")):
        if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
            continue
        if not (path.parent / target).exists():
            missing.append(target)
    assert not missing, f"{doc}: {missing}"
