"""Where each axis becomes communication-bound: the batch or width below which it waits on links.

The scaling book's part 5 ("How to Parallelize a Transformer for Training", Austin et al.,
2025) compares, per axis, the time a device computes with the time its collective takes, both
linear in the work, so their ratio is a threshold. Here the collective is the ring of
:mod:`trainfast.distributed.cost_model` (bandwidth term only, ``alpha = 0``: large messages):

* **data parallelism**: the gradient all-reduce, ``2 (N-1)/N * g P`` bytes over the link, hides
  behind the backward, ``4 P b`` FLOPs for ``b`` tokens per device. It is communication-bound
  below ``b* = (N-1)/N * g C / (2 W)`` tokens per device (``C`` FLOP/s, ``W`` bytes/s one way);
  with 2-byte gradients, ``b* ~ C / W``, the book's rule. FSDP (ZeRO-3) splits the all-reduce
  into the all-gather before the forward (``2 P b`` FLOPs) and an all-gather and a
  reduce-scatter in the backward: the same threshold.
* **tensor parallelism** (Megatron's MLP): each ``t``-way all-reduce of the ``b x D``
  activations hides behind ``4 b D F / t`` FLOPs, so it is communication-bound when the hidden
  width per rank ``F / t`` falls below ``(t-1)/t * a C / (2 W)`` (``a`` bytes per activation),
  whatever the batch.

* **mixture of experts** (the scaling book's GPU part, "MoE models"): an MoE MLP's ``E``
  experts all have gradients to reduce, but a token computes with only ``k`` of them, so data
  parallelism over an MoE MLP needs ``E / k`` times the tokens (``experts``, ``top_k``).
* **FSDP and tensor parallelism together** (part 5, on mixing the two): ``X``-way FSDP times
  ``Y``-way tensor parallelism, ``N = X Y``. FSDP gathers weights that tensor parallelism has
  already cut by ``Y``; tensor parallelism sends activations that FSDP has already cut by ``X``.
  For a batch of ``B`` tokens the forward's communication is least at
  ``X = sqrt(B M_X N / (F M_Y))`` (:func:`fsdp_tensor_split`), and the MLP stays compute-bound
  while ``B / N > 4 alpha^2 / (M_X M_Y F)`` with ``alpha = C / W``
  (:func:`fsdp_tensor_parallel_min_tokens`): below the ``alpha`` tokens per device pure FSDP
  needs once ``F > 4 alpha / (M_X M_Y)``. ``M_X``, ``M_Y``: the links each axis uses at once
  (the book's TPU meshes have several; one for a GPU's ring here). The book's derivation drops
  the rings' ``(N-1)/N`` and counts the forward only.

``matmul_efficiency`` scales ``C`` (1: the peak, as the scaling book's rules use). These are
rules of thumb, not the step model (:mod:`trainfast.distributed.step_time`): no latency, no
overlap limits, attention left out.
"""

from __future__ import annotations

from trainfast.distributed.cost_model import Link
from trainfast.validation import check_instance, check_int, check_number

__all__ = [
    "data_parallel_min_tokens",
    "fsdp_tensor_parallel_min_tokens",
    "fsdp_tensor_split",
    "tensor_parallel_min_width",
]


def _check_rates(
    peak_flops: float, link: Link, value_bytes: float, matmul_efficiency: float, bytes_name: str
) -> None:
    check_number("peak_flops", peak_flops, above=0.0)
    check_instance("link", link, Link)
    check_number(bytes_name, value_bytes, above=0.0)
    check_number("matmul_efficiency", matmul_efficiency, above=0.0, maximum=1.0)


def data_parallel_min_tokens(
    peak_flops: float,
    link: Link,
    world_size: int,
    gradient_bytes: float = 2.0,
    matmul_efficiency: float = 1.0,
    experts: int = 1,
    top_k: int = 1,
) -> float:
    """Tokens per device below which data parallelism (or FSDP) waits on its gradient traffic.

    The backward's ``4 P b`` FLOPs against the ring all-reduce of ``P`` gradients: ``b*`` solves
    ``4 P b / C = 2 (N-1)/N * gradient_bytes * P / W``, and ``P`` cancels. For an MoE MLP of
    ``experts`` experts, ``top_k`` a token: ``E`` experts' gradients against ``k`` experts'
    FLOPs, ``E / k`` times the tokens.
    """
    check_int("world_size", world_size, minimum=1)
    check_int("experts", experts, minimum=1)
    check_int("top_k", top_k, minimum=1, maximum=experts)
    _check_rates(peak_flops, link, gradient_bytes, matmul_efficiency, "gradient_bytes")
    flops = peak_flops * matmul_efficiency
    dense = (world_size - 1) / world_size * gradient_bytes * flops * link.beta / 2
    return dense * experts / top_k


def tensor_parallel_min_width(
    peak_flops: float,
    link: Link,
    tensor: int,
    activation_bytes: float = 2.0,
    matmul_efficiency: float = 1.0,
) -> float:
    """Hidden width per tensor-parallel rank, ``F / t``, below which the MLP's all-reduces are
    slower than its matmuls: ``4 b D F / (t C) = 2 (t-1)/t * activation_bytes * b D / W``."""
    check_int("tensor", tensor, minimum=1)
    _check_rates(peak_flops, link, activation_bytes, matmul_efficiency, "activation_bytes")
    flops = peak_flops * matmul_efficiency
    return (tensor - 1) / tensor * activation_bytes * flops * link.beta / 2


def fsdp_tensor_split(
    batch_tokens: float, d_ff: float, n_devices: int, fsdp_axes: float = 1, tensor_axes: float = 1
) -> float:
    """The FSDP degree ``X`` (of ``N = X Y`` devices, ``Y`` tensor-parallel) with the least
    forward communication for a batch of ``B`` tokens, ``sqrt(B M_X N / (F M_Y))`` (the scaling
    book's part 5): it minimises ``F X / (N M_X) + B / (X M_Y)``, FSDP's gathers (which shrink as
    ``Y`` grows) plus tensor parallelism's activations (which shrink as ``X`` grows). Not rounded
    to a divisor of ``N``."""
    check_int("n_devices", n_devices, minimum=1)
    for name, value in (("batch_tokens", batch_tokens), ("d_ff", d_ff)):
        check_number(name, value, above=0.0)
    for name, value in (("fsdp_axes", fsdp_axes), ("tensor_axes", tensor_axes)):
        check_number(name, value, above=0.0)
    return (batch_tokens * fsdp_axes * n_devices / (d_ff * tensor_axes)) ** 0.5


def fsdp_tensor_parallel_min_tokens(
    peak_flops: float,
    link: Link,
    d_ff: float,
    fsdp_axes: float = 1,
    tensor_axes: float = 1,
    matmul_efficiency: float = 1.0,
) -> float:
    """Tokens per device, ``B / N``, below which FSDP x tensor parallelism at its best split
    (:func:`fsdp_tensor_split`) waits on its links: ``4 alpha^2 / (M_X M_Y F)`` with
    ``alpha = C / W`` (the scaling book's part 5; ``W = 1 / link.beta``, the ring's rate)."""
    check_number("peak_flops", peak_flops, above=0.0)
    check_number("d_ff", d_ff, above=0.0)
    check_number("matmul_efficiency", matmul_efficiency, above=0.0, maximum=1.0)
    alpha = peak_flops * matmul_efficiency * link.beta
    return 4 * alpha**2 / (fsdp_axes * tensor_axes * d_ff)
