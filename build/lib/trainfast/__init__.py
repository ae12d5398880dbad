"""trainfast: the code of *Train Faster*, an executable textbook on making training fast.

Each module holds one concept of the book, named after it (``trainfast.optim``,
``trainfast.records``, ...). Import what a chapter shows; nothing here depends on the book.
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("trainfast")
except PackageNotFoundError:  # running from a source tree that was not installed
    __version__ = "0.0.0+unknown"

__all__ = ["__version__"]
