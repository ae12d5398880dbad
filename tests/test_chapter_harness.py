"""The chapter checks themselves must catch what they claim to catch."""

from __future__ import annotations

import chapters

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
    expected = ["does not resolve", "has no :pyobject:", "is not from code/trainfast",
                "unexecuted Python block", "unexecuted Python block", "defines 'pick_device'"]
    for problem, fragment in zip(problems, expected, strict=True):
        assert fragment in problem
