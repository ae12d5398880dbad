"""State files that survive a crash: written atomically, read with the file's name in errors.

A process killed while it writes a JSON file in place leaves half a file, and the next reader
either fails without saying which file or, worse, treats it as empty and writes over what was
there. :func:`write_atomically` writes to a temporary file in the same folder and renames it
over the target (``os.replace`` is atomic on POSIX and Windows), so a reader sees the old file
or the new one, never half of one. :func:`read_json` names the file when its text is not JSON.
Every state file of the package (records, sweep state, GPU-pass summaries) goes through these.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

__all__ = ["read_json", "write_atomically", "write_json_atomically"]


def write_atomically(path: str | Path, text: str) -> Path:
    """Replace ``path``'s contents with ``text`` in one step; on any error the old file stays.

    The text goes to a temporary file beside ``path``, is flushed to disk (``fsync``), and then
    renamed over ``path``.
    """
    path = Path(path)
    descriptor, temporary = tempfile.mkstemp(
        dir=path.parent, prefix=f".{path.name}.", suffix=".tmp"
    )
    try:
        with os.fdopen(descriptor, "w", encoding="utf-8") as file:
            file.write(text)
            file.flush()
            os.fsync(file.fileno())
        os.chmod(temporary, path.stat().st_mode & 0o777 if path.exists() else 0o644)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return path


def write_json_atomically(path: str | Path, data: Any, *, indent: int | None = None) -> Path:
    """``data`` as JSON in ``path``, atomically; data that is not JSON raises before anything is
    written, naming ``path`` and the cause."""
    try:
        text = json.dumps(data, indent=indent, allow_nan=True)
    except (TypeError, ValueError) as error:
        raise ValueError(f"{path}: cannot write this as JSON ({error}); nothing written") from error
    return write_atomically(path, text + "\n")


def read_json(path: str | Path) -> Any:
    """The JSON in ``path``; text that is not JSON raises ``ValueError`` naming the file."""
    path = Path(path)
    text = path.read_text(encoding="utf-8")
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(f"{path}: not valid JSON ({error})") from error
