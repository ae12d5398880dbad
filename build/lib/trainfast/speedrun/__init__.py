"""The capstone: one model trained to a target held-out loss as fast as possible.

:mod:`~trainfast.speedrun.data` makes the offline corpus, its tokenizer, the batches (a
non-repeating stream, or random windows) and the evaluation windows;
:mod:`~trainfast.speedrun.references` the unigram and bigram count models' losses that place a
target; :mod:`~trainfast.speedrun.harness` defines a :class:`SpeedrunConfig` (a frozen
configuration that names every technique) and trains it until the held-out loss first reaches
the target, timing the training apart from the evaluation; :mod:`~trainfast.speedrun.checkpoint`
stops and resumes a run exactly. :mod:`~trainfast.speedrun.changes` holds the log,
:mod:`~trainfast.speedrun.protocol` the run order and keep rule, :mod:`~trainfast.speedrun.study`
runs them into a record, :mod:`~trainfast.speedrun.headline` and :mod:`~trainfast.speedrun.gains`
read it; :mod:`~trainfast.speedrun.gpu` sizes and predicts the GPU log.
"""

from trainfast.speedrun.checkpoint import Checkpointing
from trainfast.speedrun.data import PreparedData, RandomWindows, TokenStream, prepare
from trainfast.speedrun.harness import (
    Comparison,
    RunResult,
    SpeedrunConfig,
    Target,
    compare,
    run_to_target,
)

__all__ = [
    "Checkpointing",
    "Comparison",
    "PreparedData",
    "RandomWindows",
    "RunResult",
    "SpeedrunConfig",
    "Target",
    "TokenStream",
    "compare",
    "prepare",
    "run_to_target",
]
