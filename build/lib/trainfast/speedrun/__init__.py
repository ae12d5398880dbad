"""The capstone: one model trained to a target validation loss as fast as possible.

:mod:`~trainfast.speedrun.data` makes the offline corpus, its tokenizer and non-repeating token
streams; :mod:`~trainfast.speedrun.harness` defines a :class:`SpeedrunConfig` (a frozen
configuration that names every technique) and trains it until the validation loss first
reaches the target, timing the training apart from the evaluation.
"""

from trainfast.speedrun.data import PreparedData, TokenStream, prepare
from trainfast.speedrun.harness import (
    Comparison,
    RunResult,
    SpeedrunConfig,
    Target,
    compare,
    run_to_target,
)

__all__ = [
    "Comparison",
    "PreparedData",
    "RunResult",
    "SpeedrunConfig",
    "Target",
    "TokenStream",
    "compare",
    "prepare",
    "run_to_target",
]
