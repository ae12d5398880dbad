"""Parity harnesses: each of our distributed algorithms run beside its reference, side by side.

These are :func:`~trainfast.distributed.spawn` workers (so they live in an importable package,
where the spawned processes can find them), used by the tests and the chapter:

* :mod:`~trainfast.distributed.parity.collectives`: every collective against
  ``torch.distributed``'s, on random inputs of many shapes and dtypes;
* :mod:`~trainfast.distributed.parity.exchange`: the collectives that send different blocks
  to different ranks (scatter, gather, all-to-all);
* :mod:`~trainfast.distributed.parity.strategies`: every data-parallel strategy of
  :mod:`~trainfast.distributed.strategy` against one process, on a model with tied, frozen
  and unused parameters.
"""

__all__: list[str] = []
