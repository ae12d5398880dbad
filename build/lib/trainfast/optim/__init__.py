"""Optimizers written out: SGD, RMSprop, Adam, AdamW and Muon, each checked against torch.

Every algorithm is a pure function (:func:`sgd`, :func:`rmsprop`, :func:`adam`, :func:`muon`)
with two implementations behind one ``foreach`` flag: a readable loop over tensors, the one the
chapter shows, and a ``torch._foreach_*`` version that launches one kernel per list on a GPU
(on a CPU, torch loops over the list in C++). The classes
subclass ``torch.optim.Optimizer`` (so LR schedulers, ``state_dict`` and ``zero_grad`` work),
keep the state and call the functions. :mod:`~trainfast.optim.state` measures state memory;
:mod:`~trainfast.optim.benchmarks` times a step against ``torch.optim`` (import it from there; it is
also ``python -m trainfast.optim.benchmarks``).
"""

from trainfast.optim.adam import Adam, AdamW, adam
from trainfast.optim.muon import (
    Muon,
    muon,
    muon_param_groups,
    muon_update,
    orthogonalized_update,
    zeropower_via_newtonschulz5,
)
from trainfast.optim.rmsprop import RMSprop, rmsprop
from trainfast.optim.sgd import SGD, sgd
from trainfast.optim.state import state_bytes, state_bytes_per_param, state_bytes_table

__all__ = [
    "SGD",
    "Adam",
    "AdamW",
    "Muon",
    "RMSprop",
    "adam",
    "muon",
    "muon_param_groups",
    "muon_update",
    "orthogonalized_update",
    "rmsprop",
    "sgd",
    "state_bytes",
    "state_bytes_per_param",
    "state_bytes_table",
    "zeropower_via_newtonschulz5",
]
