"""Every random generator a training run draws from, saved and restored together.

A run that resumes from a checkpoint continues *exactly* only if each generator it draws from
is where it was: the data order's, the CPU's default generator (initialisation, dropout on CPU
tensors), and the accelerator's (dropout on a CUDA tensor draws from the CUDA generator of its
device, not from the CPU one; ``torch.get_rng_state()`` is "for the default generator on CPU
only", torch/random.py). A run may also own generators of its own (an augmentation's, a noise
layer's); they are passed by name and kept beside the rest.

Bit-equal weights after a resume need deterministic kernels as well: on a GPU some kernels
(atomic additions in a convolution's backward pass, for instance) are not, unless
``torch.use_deterministic_algorithms(True)`` is set.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

__all__ = ["random_states", "restore_random_states"]


def random_states(
    device: torch.device, generators: Mapping[str, torch.Generator] | None = None
) -> dict[str, Any]:
    """The state of every generator a run on ``device`` draws from, plus ``generators``.

    ``"cpu"`` is the default CPU generator; ``"cuda"`` the default generator of every CUDA
    device, saved whenever CUDA has been initialised in this process (a run on a GPU has) or the
    run is on CUDA; ``"mps"`` the MPS generator for a run on MPS; ``"generators"`` the named
    generators the run owns (the data order's among them).
    """
    states: dict[str, Any] = {
        "cpu": torch.get_rng_state(),
        "generators": {name: g.get_state() for name, g in (generators or {}).items()},
    }
    if device.type == "cuda" or (torch.cuda.is_available() and torch.cuda.is_initialized()):
        states["cuda"] = torch.cuda.get_rng_state_all()
    if device.type == "mps":
        states["mps"] = torch.mps.get_rng_state()
    return states


def restore_random_states(
    states: Mapping[str, Any], generators: Mapping[str, torch.Generator] | None = None
) -> None:
    """Set every generator back to ``states`` (from :func:`random_states`).

    ``generators`` must name the same generators as when the states were saved: a generator
    saved and not given back, or given and never saved, is a ``ValueError`` naming it, since
    the resumed run would otherwise draw from a generator in the wrong state.
    """
    saved, generators = states["generators"], generators or {}
    if set(saved) != set(generators):
        raise ValueError(
            f"The checkpoint holds the generators {sorted(saved)}, this run has "
            f"{sorted(generators)}: pass the same generators to resume exactly"
        )
    for name, generator in generators.items():
        generator.set_state(saved[name])
    torch.set_rng_state(states["cpu"])
    if "cuda" in states:
        if len(states["cuda"]) > torch.cuda.device_count():
            raise ValueError(
                f"The checkpoint holds the generators of {len(states['cuda'])} CUDA devices, "
                f"this machine has {torch.cuda.device_count()}: it cannot resume exactly here"
            )
        torch.cuda.set_rng_state_all(states["cuda"])
    if "mps" in states:
        torch.mps.set_rng_state(states["mps"])
