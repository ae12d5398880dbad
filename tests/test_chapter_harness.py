"""The chapter checks themselves must catch what they claim to catch."""

from __future__ import annotations

import chapters
import nbformat
import pytest

PACKAGE = chapters.PACKAGE

FRONT = """---
jupytext:
  text_representation:
    format_name: myst
kernelspec:
  name: python3
  display_name: Python 3
  language: python
---
"""


def _problems(tmp_path, monkeypatch, body: str) -> list[str]:
    monkeypatch.setattr(chapters, "BOOK", tmp_path)
    (tmp_path / "demo.md").write_text(FRONT + body)
    return chapters.listing_problems("demo")


def test_a_clean_chapter_has_no_problems(tmp_path, monkeypatch):
    body = f"""
```{{literalinclude}} {PACKAGE}/device.py
:pyobject: pick_device
```

```{{code-cell}} ipython3
def my_own_helper():
    return 1
```

```{{code-block}} python
:class: excerpt
:caption: Excerpt from torch/optim/sgd.py
x = 1
```
"""
    assert _problems(tmp_path, monkeypatch, body) == []


def test_each_kind_of_breach_is_reported(tmp_path, monkeypatch):
    body = f"""
```{{literalinclude}} {PACKAGE}/device.py
:pyobject: no_such_function
```

```{{literalinclude}} {PACKAGE}/device.py
```

```{{literalinclude}} /etc/hostname
:pyobject: x
```

```python
def pasted(): ...
```

:::{{note}}
```{{code-block}} python
print("nested and unmarked")
```
:::

```{{code-cell}} ipython3
def pick_device():
    return "copied"
```
"""
    problems = _problems(tmp_path, monkeypatch, body)
    assert len(problems) == 6, problems
    expected = [
        "does not resolve",
        "has no :pyobject:",
        "is not from code/trainfast",
        "unexecuted Python block",
        "unexecuted Python block",
        "defines 'pick_device'",
    ]
    for problem, fragment in zip(problems, expected, strict=True):
        assert fragment in problem


# --- one execution per chapter: the build's executed notebook, only when provably current ---


def _cache_with(tmp_path, monkeypatch, notebook, *, stamp: str | None = None):
    """A jupyter-cache in tmp_path: ``notebook`` (as if executed) and a watched-sources stamp."""
    import sys

    from jupyter_cache import get_cache
    from jupyter_cache.base import CacheBundleIn

    monkeypatch.setattr(chapters, "BOOK", tmp_path)
    cache_dir = tmp_path / "cache"
    jcache = get_cache(cache_dir)
    jcache.cache_notebook_bundle(
        CacheBundleIn(notebook, str(tmp_path / "demo.md"), data={"execution_seconds": 4.5}),
        check_validity=False,
        overwrite=True,
    )
    sys.path.insert(0, str(chapters.ROOT / "book" / "_ext"))
    import build_support

    sys.path.remove(str(chapters.ROOT / "book" / "_ext"))
    config = chapters.yaml.safe_load((chapters.ROOT / "_config.yml").read_text())
    watched = [chapters.ROOT / p for p in config["sphinx"]["config"]["build_support_watch"]]
    current = build_support.source_hash(watched)  # the sources the build stamps, as it does
    (cache_dir / build_support.STAMP_NAME).write_text((stamp or current) + "\n")
    return cache_dir


def _demo(tmp_path, body: str = "```{code-cell} ipython3\nx = 1\n```\n"):
    (tmp_path / "demo.md").write_text(FRONT + body)


def test_the_builds_execution_is_taken_only_when_sources_and_package_are_current(
    tmp_path, monkeypatch
):
    _demo(tmp_path)
    monkeypatch.setattr(chapters, "BOOK", tmp_path)
    executed = chapters.read_chapter("demo")
    executed.cells[0].outputs = [nbformat.v4.new_output("stream", name="stdout", text="ok\n")]
    cache = _cache_with(tmp_path, monkeypatch, executed)
    found = chapters.executed_by_the_build("demo", cache)
    assert found.seconds == 4.5 and found.notebook.cells[0].outputs[0]["text"] == "ok\n"
    assert found.cpu_seconds is None  # a cache filled without the CPU time says so
    # the chapter changed since the build: no match, so it must be executed again
    _demo(tmp_path, "```{code-cell} ipython3\nx = 2\n```\n")
    assert chapters.executed_by_the_build("demo", cache) is None
    # the package changed since the build: the stamp no longer matches
    _demo(tmp_path)
    stale = _cache_with(tmp_path, monkeypatch, executed, stamp="0" * 64)
    assert chapters.executed_by_the_build("demo", stale) is None
    assert chapters.executed_by_the_build("demo", tmp_path / "no-cache") is None


def test_an_error_in_the_builds_execution_is_reported(tmp_path, monkeypatch):
    _demo(tmp_path)
    monkeypatch.setattr(chapters, "BOOK", tmp_path)
    executed = chapters.read_chapter("demo")
    executed.cells[0].outputs = [
        nbformat.v4.new_output("error", ename="ValueError", evalue="boom", traceback=[])
    ]
    assert chapters.cell_errors(executed) == ["ValueError: boom"]
    monkeypatch.setattr(chapters, "EXECUTION_CACHE", _cache_with(tmp_path, monkeypatch, executed))
    with pytest.raises(AssertionError, match="raised in the book build: ValueError: boom"):
        chapters.execute_chapter("demo")


def test_a_chapter_is_executed_once_per_session_and_never_twice_after_make_book(
    tmp_path, monkeypatch
):
    _demo(tmp_path, "```{code-cell} ipython3\nprint(6 * 7)\n```\n")
    monkeypatch.setattr(chapters, "BOOK", tmp_path)
    monkeypatch.setattr(chapters, "EXECUTION_CACHE", tmp_path / "no-cache")
    monkeypatch.setattr(chapters, "EXECUTED", {})
    monkeypatch.setenv("TRAINFAST_BUILT_FIRST", "1")
    with pytest.raises(AssertionError, match="TRAINFAST_BUILT_FIRST=1"):
        chapters.execute_chapter("demo")
    monkeypatch.delenv("TRAINFAST_BUILT_FIRST")
    notebook = chapters.executed_notebook("demo")
    assert notebook.cells[0].outputs[0]["text"] == "42\n"
    _demo(tmp_path, "```{code-cell} ipython3\nraise ValueError('not run again')\n```\n")
    assert chapters.executed_notebook("demo") is notebook
