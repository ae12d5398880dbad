"""Runs at the start of every kernel that executes a page for the book's build.

It writes into each PNG a figure produces the size of the smallest text the figure draws, in
points, as the PNG text chunk ``trainfast:smallest-text-pt``. The page shows a figure scaled to its
column (``book/_static/layout.css``), and ``tests/test_site_layout.py`` multiplies that size by
the scale the browser drew the figure at, so it can say, per figure, whether its text is legible
at 1400 px and on a 390 px phone.

``build_support.page_assets`` copies this file into the IPython profile of the kernels it starts
(``IPYTHONDIR``), so a reader's own Jupyter or Colab never runs it.
"""

import matplotlib.text
from matplotlib.backends import backend_agg

_print_png = backend_agg.FigureCanvasAgg.print_png


def _smallest_text_pt(figure):
    """The smallest font size, in points, of the visible, non-empty texts of ``figure``."""
    sizes = [
        text.get_fontsize()
        for text in figure.findobj(matplotlib.text.Text)
        if text.get_visible() and text.get_text().strip() and text.get_alpha() != 0
    ]
    return min(sizes, default=None)


def _print_png_with_text_size(self, filename_or_obj, *, metadata=None, pil_kwargs=None):
    metadata = dict(metadata or {})
    smallest = _smallest_text_pt(self.figure)
    if smallest is not None:
        metadata["trainfast:smallest-text-pt"] = f"{smallest:.2f}"
    return _print_png(self, filename_or_obj, metadata=metadata, pil_kwargs=pil_kwargs)


# matplotlib hands its own print methods only the options they take (``orientation`` and the
# like are filtered out for a method whose module is matplotlib's), so this one passes for its.
_print_png_with_text_size.__module__ = _print_png.__module__
_print_png_with_text_size.__wrapped__ = _print_png
backend_agg.FigureCanvasAgg.print_png = _print_png_with_text_size
