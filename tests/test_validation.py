"""``trainfast.validation.plural`` and the sentences that count with it."""

from __future__ import annotations

import re

import pytest
from trainfast.timing import Timing, readable_seconds
from trainfast.validation import plural


def test_plural_writes_a_count_as_a_sentence_does():
    assert plural(1, "block") == "1 block"
    assert plural(0, "block") == "0 blocks"
    assert plural(2, "graph break") == "2 graph breaks"
    assert plural(1024, "block") == "1,024 blocks"
    assert (plural(1, "pass", "passes"), plural(3, "pass", "passes")) == ("1 pass", "3 passes")


@pytest.mark.parametrize("count", [-1, 1.5, True, "2"])
def test_plural_names_a_count_that_is_not_one(count):
    with pytest.raises(ValueError, match=re.escape(f"Invalid count: {count!r}")):
        plural(count, "block")


def test_a_timing_reads_as_a_sentence():
    """``Timing`` counts its samples, calls and threads with ``plural``."""
    one = Timing(samples=(2e-3,), device="cpu", device_name="x", threads=1, warmup=0, number=1)
    assert str(one) == "2 ms median, IQR 0 s (1 sample of 1 call on cpu, 1 thread)"
    many = Timing((1e-3, 2e-3, 4e-3), "cpu", "x", threads=4, warmup=0, number=10)
    assert str(many).endswith("(3 samples of 10 calls on cpu, 4 threads)")


def test_readable_seconds_picks_the_unit_that_reads():
    assert [readable_seconds(v) for v in (6.3014, 7.5157e-4, 0.0125, 4e-8, 1234.4, 0.0)] == [
        "6.3 s",
        "752 µs",
        "12.5 ms",
        "40 ns",
        "1,234 s",
        "0 s",
    ]
