"""The appendix pages (launching and restarting; several agents on one sweep).

They have no exercises: they carry material moved out of the parallelism and hyperparameters
chapters. The build executes them (a failing cell fails ``make book``); here their listings must
be the package's own public objects, as a chapter's are.
"""

import chapters
import pytest


@pytest.mark.parametrize("page", ["appendix/launching", "appendix/sweep_agents"])
def test_listings_resolve_to_package_code(page):
    assert chapters.chapter_path(page).exists(), page
    assert chapters.listing_problems(page) == []
