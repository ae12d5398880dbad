"""The memory-hierarchy chapter: every kernel against its PyTorch reference, and the chapter.

Triton kernels run here through Triton's CPU interpreter (``TRITON_INTERPRET=1``, set by
``trainfast.kernels.triton_runtime`` on a machine without CUDA), at small sizes; the same tests
run compiled on a GPU, and ``@pytest.mark.gpu`` tests add bfloat16 and GPU-sized cases. The C++
operator is compiled once per machine (cached under ``TORCH_EXTENSIONS_DIR``).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F
from trainfast.kernels import (
    FlashAttention,
    attention_reference,
    bias_gelu,
    bias_gelu_reference,
    flash_attention,
    merge_attention_outputs,
    merge_softmax_stats,
    online_softmax,
    softmax_stats,
)

CUDA = torch.cuda.is_available()
gpu = pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
DEVICE = torch.device("cuda" if CUDA else "cpu")

# Tolerances against a float64 reference: float32 rounding, and float16/bfloat16 inputs and
# outputs (the kernels accumulate in float32; the error is the rounding of the 16-bit output).
TOLERANCE = {
    torch.float64: {"atol": 1e-10, "rtol": 1e-10},
    torch.float32: {"atol": 2e-5, "rtol": 2e-5},
    torch.float16: {"atol": 4e-3, "rtol": 4e-3},
    torch.bfloat16: {"atol": 3e-2, "rtol": 3e-2},
}


def _qkv(shape_q, shape_k, dtype, device=DEVICE, seed=0):
    generator = torch.Generator().manual_seed(seed)
    q = torch.randn(shape_q, generator=generator).to(device, dtype).requires_grad_()
    k = torch.randn(shape_k, generator=generator).to(device, dtype).requires_grad_()
    v = torch.randn(shape_k, generator=generator).to(device, dtype).requires_grad_()
    return q, k, v


def _assert_matches_sdpa(attend, q, k, v, is_causal, dtype):
    """Output and gradients of ``attend`` against float64 SDPA on the same inputs."""
    out = attend(q, k, v, is_causal)
    grad_out = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), grad_out)
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    expected = F.scaled_dot_product_attention(q64, k64, v64, is_causal=is_causal)
    expected_grads = torch.autograd.grad(expected, (q64, k64, v64), grad_out.double())
    assert out.dtype == dtype and out.shape == q.shape
    tolerance = TOLERANCE[dtype]
    torch.testing.assert_close(out.double(), expected, **tolerance)
    # gradients sum over the sequence: allow a few roundings more
    for name, grad, reference in zip("qkv", grads, expected_grads, strict=True):
        scale = 1 + reference.abs().max().item()
        torch.testing.assert_close(
            grad.double(),
            reference,
            atol=tolerance["atol"] * 4 * scale,
            rtol=tolerance["rtol"] * 4,
            msg=lambda m, name=name: f"d{name}: {m}",
        )


# --- online softmax and the merges ---------------------------------------------------------


@pytest.mark.parametrize("block_size", [1, 7, 128, 1000])
def test_online_softmax_matches_torch(block_size):
    x = torch.randn(3, 5, 301, dtype=torch.float64) * 20  # large values: the running max matters
    torch.testing.assert_close(online_softmax(x, block_size=block_size), torch.softmax(x, dim=-1))
    running_max, running_sum = softmax_stats(x, block_size=block_size)
    torch.testing.assert_close(running_max, x.amax(dim=-1))
    torch.testing.assert_close(running_max + running_sum.log(), torch.logsumexp(x, dim=-1))


def test_online_softmax_survives_values_that_overflow_exp():
    x = torch.tensor([[1000.0, 999.0, -1000.0]])
    assert torch.isinf(torch.exp(x)).any()  # the naive formula would give NaN
    torch.testing.assert_close(online_softmax(x, block_size=1), torch.softmax(x, dim=-1))


def test_merge_softmax_stats_is_order_free_and_has_an_identity():
    x = torch.randn(4, 90, dtype=torch.float64)
    parts = [softmax_stats(x[:, i : i + 30]) for i in (0, 30, 60)]
    left = merge_softmax_stats(*merge_softmax_stats(*parts[0], *parts[1]), *parts[2])
    right = merge_softmax_stats(*parts[0], *merge_softmax_stats(*parts[2], *parts[1]))
    torch.testing.assert_close(left, right)
    torch.testing.assert_close(left, softmax_stats(x))
    empty = (
        torch.full((4,), float("-inf"), dtype=torch.float64),
        torch.zeros(4, dtype=torch.float64),
    )
    torch.testing.assert_close(merge_softmax_stats(*empty, *parts[0]), parts[0])
    both_empty = merge_softmax_stats(*empty, *empty)
    assert not torch.isnan(both_empty[1]).any() and (both_empty[1] == 0).all()
    with pytest.raises(ValueError, match="block_size: 0"):
        softmax_stats(x, block_size=0)


def _attention_and_lse(q, k, v):
    scores = q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5
    return torch.softmax(scores, dim=-1) @ v, torch.logsumexp(scores, dim=-1)


def test_merge_attention_outputs_equals_attention_over_all_keys():
    q, k, v = (t.detach().double() for t in _qkv((2, 9, 16), (2, 40, 16), torch.float64, "cpu"))
    out_a, lse_a = _attention_and_lse(q, k[:, :25], v[:, :25])
    out_b, lse_b = _attention_and_lse(q, k[:, 25:], v[:, 25:])
    merged, lse = merge_attention_outputs(out_a, lse_a, out_b, lse_b)
    expected, expected_lse = _attention_and_lse(q, k, v)
    torch.testing.assert_close(merged, expected)
    torch.testing.assert_close(lse, expected_lse)
    # a part in which a query saw no key (lse = -inf, output NaN) leaves the other part unchanged
    nothing = torch.full_like(lse_a, float("-inf"))
    merged, lse = merge_attention_outputs(
        out_a, lse_a, torch.full_like(out_b, float("nan")), nothing
    )
    torch.testing.assert_close(merged, out_a)
    torch.testing.assert_close(lse, lse_a)


def test_flash_attention_lse_merges_like_ring_attention():
    """Flash attention over two key blocks, merged, equals flash attention over all keys."""
    q, k, v = (t.detach() for t in _qkv((2, 3, 20, 32), (2, 3, 50, 32), torch.float64, "cpu"))
    from trainfast.kernels.attention import flash_attention_forward

    out_a, lse_a = flash_attention_forward(
        q, k[..., :30, :], v[..., :30, :], tile_queries=8, tile_keys=8
    )
    out_b, lse_b = flash_attention_forward(
        q, k[..., 30:, :], v[..., 30:, :], tile_queries=8, tile_keys=8
    )
    merged, _ = merge_attention_outputs(out_a, lse_a, out_b, lse_b)
    torch.testing.assert_close(merged, F.scaled_dot_product_attention(q, k, v))


# --- flash attention, tiled in PyTorch -----------------------------------------------------

# (n_queries, n_keys, head_dim): multiples of the tile and not, more queries than keys, fewer
ATTENTION_SHAPES = [(37, 37, 16), (20, 50, 24), (50, 20, 64), (1, 1, 32), (64, 64, 128)]


@pytest.fixture
def small_tiles(monkeypatch):
    monkeypatch.setattr(FlashAttention, "tile_queries", 16)
    monkeypatch.setattr(FlashAttention, "tile_keys", 8)


@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("shape", ATTENTION_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_tiled_flash_attention_matches_sdpa(small_tiles, shape, dtype, is_causal):
    n_queries, n_keys, head_dim = shape
    q, k, v = _qkv((2, 3, n_queries, head_dim), (2, 3, n_keys, head_dim), dtype)
    _assert_matches_sdpa(flash_attention, q, k, v, is_causal, dtype)


def test_tiled_flash_attention_gradcheck_float64(monkeypatch):
    monkeypatch.setattr(FlashAttention, "tile_queries", 4)
    monkeypatch.setattr(FlashAttention, "tile_keys", 3)
    q, k, v = _qkv((1, 1, 9, 16), (1, 1, 7, 16), torch.float64, "cpu")
    for is_causal in (False, True):
        assert torch.autograd.gradcheck(
            lambda q, k, v, is_causal=is_causal: FlashAttention.apply(q, k, v, is_causal),
            (q, k, v),
            fast_mode=True,
        )


#: SDPA's enable_gqa, the reference of the grouped-query tests, arrived in torch 2.5
sdpa_has_gqa = pytest.mark.skipif(
    "enable_gqa" not in (F.scaled_dot_product_attention.__doc__ or ""),
    reason=f"torch {torch.__version__}'s SDPA has no enable_gqa (added in 2.5)",
)


@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("n_heads, n_kv_heads", [(6, 2), (4, 1), (3, 3)])
@sdpa_has_gqa
def test_tiled_grouped_query_attention_matches_sdpa_enable_gqa(
    small_tiles, n_heads, n_kv_heads, is_causal
):
    q, k, v = _qkv((2, n_heads, 37, 16), (2, n_kv_heads, 29, 16), torch.float64, "cpu")
    out = flash_attention(q, k, v, is_causal, enable_gqa=True)
    grad_out = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), grad_out)
    expected = F.scaled_dot_product_attention(q, k, v, is_causal=is_causal, enable_gqa=True)
    expected_grads = torch.autograd.grad(expected, (q, k, v), grad_out)
    # and SDPA's convention is query head h on KV head h // group: K, V repeat_interleave'd
    group = n_heads // n_kv_heads
    repeated = F.scaled_dot_product_attention(
        q, k.repeat_interleave(group, -3), v.repeat_interleave(group, -3), is_causal=is_causal
    )
    torch.testing.assert_close(out, expected, **TOLERANCE[torch.float64])
    torch.testing.assert_close(out, repeated, **TOLERANCE[torch.float64])
    for grad, expected_grad in zip(grads, expected_grads, strict=True):
        assert grad.shape == expected_grad.shape
        torch.testing.assert_close(grad, expected_grad, **TOLERANCE[torch.float64])


def test_grouped_query_attention_rejects_heads_that_do_not_divide():
    q, k, v = torch.randn(1, 6, 8, 16), torch.randn(1, 4, 8, 16), torch.randn(1, 4, 8, 16)
    for implementation in ("tiled", "triton"):
        with pytest.raises(ValueError, match=r"same leading dimensions.*\(1, 6\).*\(1, 4\)"):
            flash_attention(q, k, v, enable_gqa=True, implementation=implementation)
        with pytest.raises(ValueError, match=r"same leading dimensions"):  # GQA must be asked for
            flash_attention(q, k[:, :2], v[:, :2], implementation=implementation)


@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
@sdpa_has_gqa
def test_triton_grouped_query_attention_matches_sdpa_enable_gqa(is_causal):
    q, k, v = _qkv((2, 4, 37, 16), (2, 2, 45, 16), torch.float32)
    out = flash_attention(q, k, v, is_causal, implementation="triton", enable_gqa=True)
    grad_out = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), grad_out)
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    expected = F.scaled_dot_product_attention(q64, k64, v64, is_causal=is_causal, enable_gqa=True)
    expected_grads = torch.autograd.grad(expected, (q64, k64, v64), grad_out.double())
    torch.testing.assert_close(out.double(), expected, **TOLERANCE[torch.float32])
    for grad, expected_grad in zip(grads, expected_grads, strict=True):
        assert grad.shape == expected_grad.shape
        torch.testing.assert_close(grad.double(), expected_grad, **TOLERANCE[torch.float32])


def test_causal_convention_is_sdpas_top_left_mask():
    """With 2 queries and 5 keys, query 0 sees key 0 only and query 1 keys 0 and 1 (SDPA's rule)."""
    q = torch.zeros(1, 2, 16, dtype=torch.float64)
    k = torch.zeros(1, 5, 16, dtype=torch.float64)
    v = torch.arange(5, dtype=torch.float64).reshape(1, 5, 1).expand(1, 5, 16).contiguous()
    expected = torch.tensor([0.0, 0.5], dtype=torch.float64)  # uniform weights over visible keys
    torch.testing.assert_close(
        F.scaled_dot_product_attention(q, k, v, is_causal=True)[0, :, 0], expected
    )
    torch.testing.assert_close(flash_attention(q, k, v, is_causal=True)[0, :, 0], expected)
    torch.testing.assert_close(attention_reference(q, k, v, is_causal=True)[0, :, 0], expected)


def _masks(n_queries, n_keys):
    """Boolean masks (True: attend) of several patterns, broadcast like SDPA's attn_mask."""
    generator = torch.Generator().manual_seed(3)
    rows = torch.arange(n_queries)[:, None]
    cols = torch.arange(n_keys)[None, :]
    padded = torch.ones(2, 1, 1, n_keys, dtype=torch.bool)
    padded[1, ..., n_keys - 5 :] = False  # the second sequence's last 5 keys are padding
    documents = (rows // 4) == (cols // 4)  # block-diagonal: queries see their own document
    return {
        "random": torch.rand(2, 3, n_queries, n_keys, generator=generator) > 0.4,
        "padding": padded,
        "sliding window": (cols <= rows) & (cols > rows - 3),
        "documents": documents,
        "a query that sees nothing": documents & (rows != 2),
    }


@pytest.mark.parametrize("pattern", list(_masks(9, 11)))
def test_attention_reference_takes_sdpas_boolean_mask(pattern):
    """Output and gradients against SDPA with the same mask, in float64; a query row with no
    visible key gets zeros and zero gradients from both (PyTorch 2.5's safe softmax)."""
    q, k, v = _qkv((2, 3, 9, 16), (2, 3, 11, 16), torch.float64, device="cpu")
    mask = _masks(9, 11)[pattern]
    out = attention_reference(q, k, v, attn_mask=mask)
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    torch.testing.assert_close(out, expected, **TOLERANCE[torch.float64])
    grad_out = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), grad_out)
    expected_grads = torch.autograd.grad(expected, (q, k, v), grad_out)
    for name, grad, reference in zip("qkv", grads, expected_grads, strict=True):
        assert torch.isfinite(grad).all(), name
        torch.testing.assert_close(grad, reference, **TOLERANCE[torch.float64], msg=name)
    if pattern == "a query that sees nothing":
        assert out[..., 2, :].abs().max() == 0


def test_attention_reference_mask_equal_to_causal_is_causal():
    q, k, v = _qkv((1, 2, 7, 16), (1, 2, 7, 16), torch.float64, device="cpu")
    causal = torch.ones(7, 7, dtype=torch.bool).tril()
    torch.testing.assert_close(
        attention_reference(q, k, v, attn_mask=causal), attention_reference(q, k, v, True)
    )


@pytest.mark.parametrize(
    ("mask", "is_causal", "message"),
    [
        (
            torch.ones(7, 7),
            False,
            r"attn_mask must be a boolean tensor \(True: attend\), got "
            r"torch.float32",
        ),
        ([[True]], False, r"attn_mask must be a boolean tensor \(True: attend\), got list"),
        (
            torch.ones(7, 6, dtype=torch.bool),
            False,
            r"attn_mask of shape \(7, 6\) does not "
            r"broadcast to the scores' \(..., n_queries, n_keys\) = \(1, 2, 7, 7\)",
        ),
        (torch.ones(3, 1, 7, 7, dtype=torch.bool), False, r"attn_mask of shape \(3, 1, 7, 7\)"),
        (torch.ones(7, 7, dtype=torch.bool), True, r"Give attn_mask or is_causal=True, not both"),
    ],
)
def test_attention_reference_names_a_bad_mask(mask, is_causal, message):
    q, k, v = _qkv((1, 2, 7, 16), (1, 2, 7, 16), torch.float64, device="cpu")
    with pytest.raises(ValueError, match=message):
        attention_reference(q, k, v, is_causal, attn_mask=mask)


def _saved_shapes(out):
    return [tuple(t.shape) for t in out.grad_fn.saved_tensors]


def test_flash_attention_saves_only_inputs_output_and_logsumexp(small_tiles):
    q, k, v = _qkv((2, 3, 40, 16), (2, 3, 56, 16), torch.float32)
    out = flash_attention(q, k, v, is_causal=True)
    assert _saved_shapes(out) == [
        (2, 3, 40, 16),
        (2, 3, 56, 16),
        (2, 3, 56, 16),
        (2, 3, 40, 16),
        (2, 3, 40),
    ]
    assert all(t.numel() < 40 * 56 for t in out.grad_fn.saved_tensors[4:])
    # the textbook version saves the 40 × 56 probabilities (at least once)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(
        lambda t: saved.append(t.shape) or t, lambda t: t
    ):
        attention_reference(q, k, v, is_causal=True)
    assert (2, 3, 40, 56) in saved


# --- flash attention in Triton (interpreted on CPU) -----------------------------------------

TRITON_CASES = [  # (n_queries, n_keys, head_dim, dtype, is_causal)
    (37, 37, 16, torch.float32, False),
    (37, 37, 16, torch.float32, True),
    (20, 50, 24, torch.float16, True),
    (50, 20, 32, torch.float32, True),
    (50, 20, 32, torch.float16, False),
    (70, 33, 80, torch.float32, True),
    (33, 70, 128, torch.float16, True),
    (1, 1, 64, torch.float32, False),
    # several full tiles below the causal diagonal: the backward's unmasked runs (32 × 32 tiles)
    (100, 100, 16, torch.float32, True),
    (65, 96, 16, torch.float32, True),
]


@pytest.mark.parametrize(
    "case",
    TRITON_CASES,
    ids=lambda c: f"{c[0]}x{c[1]}x{c[2]}-{str(c[3])[6:]}-{'causal' if c[4] else 'full'}",
)
def test_triton_flash_attention_matches_sdpa(case):
    from trainfast.kernels import FlashAttentionTriton

    n_queries, n_keys, head_dim, dtype, is_causal = case
    q, k, v = _qkv((2, 2, n_queries, head_dim), (2, 2, n_keys, head_dim), dtype)
    _assert_matches_sdpa(FlashAttentionTriton.apply, q, k, v, is_causal, dtype)


@pytest.mark.parametrize("shape", [(2, 3, 37, 24), (1, 1, 64, 16), (5, 128)])
def test_triton_backward_delta_matches_rowsum_of_do_times_o(shape):
    from trainfast.kernels.attention_triton import attention_backward_delta

    generator = torch.Generator().manual_seed(0)
    out, grad_out = (torch.randn(shape, generator=generator).to(DEVICE) for _ in range(2))
    delta = attention_backward_delta(out, grad_out, block_rows=16)
    assert delta.shape == shape[:-1] and delta.dtype == torch.float32
    torch.testing.assert_close(delta, (grad_out * out).sum(-1), atol=1e-5, rtol=1e-5)


def test_triton_backward_delta_rejects_mismatched_shapes():
    from trainfast.kernels.attention_triton import attention_backward_delta

    with pytest.raises(ValueError, match=r"\(2, 3\) and \(2, 4\)"):
        attention_backward_delta(torch.zeros(2, 3), torch.zeros(2, 4))


class _OpContext:
    """What ``torch.library.register_autograd`` hands the setup and backward functions."""

    def save_for_backward(self, *tensors):
        self.saved_tensors = tensors


def _explicit_attention64(q, k, v, is_causal):
    """O and L in float64 from an explicit softmax and logsumexp, k and v repeated per group."""
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    group = q.shape[1] // k.shape[1]
    k_rep, v_rep = (t.repeat_interleave(group, dim=1) for t in (k64, v64))
    scores = q64 @ k_rep.transpose(-2, -1) * q.shape[-1] ** -0.5
    if is_causal:  # aligned at the top-left, as SDPA's
        mask = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool).tril()
        scores = scores.masked_fill(~mask, float("-inf"))
    return (q64, k64, v64), torch.softmax(scores, dim=-1) @ v_rep, torch.logsumexp(scores, dim=-1)


def _expected_grads(q, k, v, is_causal, grad_out, grad_lse):
    """Float64 autograd of ``Σ O·grad_out + Σ L·grad_lse`` (a None term left out; L alone
    does not read v, whose gradient is then zeros)."""
    inputs, out, lse = _explicit_attention64(q, k, v, is_causal)
    loss = sum(
        (o * g.double()).sum() for o, g in ((out, grad_out), (lse, grad_lse)) if g is not None
    )
    return torch.autograd.grad(loss, inputs, allow_unused=True, materialize_grads=True)


@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("n_kv_heads", [4, 2])
def test_triton_backward_with_grad_lse_matches_autograd_of_out_and_lse(is_causal, n_kv_heads):
    """``flash_attention_triton_backward`` with L's gradient folded into D, against float64
    autograd of an explicit softmax and logsumexp, for a loss that reads both outputs (O and
    L), with and without grouped-query attention."""
    from trainfast.kernels.attention_triton import (
        flash_attention_triton_backward,
        flash_attention_triton_forward,
    )

    q, k, v = _qkv((2, 4, 37, 16), (2, n_kv_heads, 45, 16), torch.float32)
    with torch.no_grad():
        out, lse = flash_attention_triton_forward(q, k, v, is_causal, enable_gqa=n_kv_heads < 4)
    generator = torch.Generator().manual_seed(1)
    grad_out = torch.randn(out.shape, generator=generator)
    grad_lse = torch.randn(lse.shape, generator=generator)
    grads = flash_attention_triton_backward(grad_out, q, k, v, out, lse, is_causal, None, grad_lse)

    _, _, expected_lse = _explicit_attention64(q, k, v, is_causal)
    torch.testing.assert_close(lse.double(), expected_lse, atol=2e-5, rtol=2e-5)
    expected_grads = _expected_grads(q, k, v, is_causal, grad_out, grad_lse)
    for name, grad, reference in zip("qkv", grads, expected_grads, strict=True):
        torch.testing.assert_close(grad.double(), reference, atol=1e-4, rtol=1e-4, msg=name)
    # the same gradients with grad_lse left out are those of O alone: L's term is not a no-op
    without_lse = flash_attention_triton_backward(grad_out, q, k, v, out, lse, is_causal)
    assert not torch.allclose(without_lse[0], grads[0], atol=1e-3)


def _registered_flash_attention_op():
    """The registered forward operator, or a skip that names the PyTorch version lacking it."""
    if not hasattr(torch.library, "triton_op"):
        pytest.skip(f"torch.library.triton_op needs torch 2.6; this is {torch.__version__}")
    from trainfast.kernels.attention_triton import register_flash_attention_op

    op = register_flash_attention_op()
    if op is None:
        pytest.skip(f"torch {torch.__version__}'s wrap_triton refuses these kernels")
    return op


@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("n_kv_heads", [4, 2])
def test_registered_op_differentiates_like_explicit_softmax_and_logsumexp(is_causal, n_kv_heads):
    """Autograd through ``torch.ops.trainfast_kernels.flash_attention_forward`` (the operators
    that ``register_flash_attention_op`` registers, eagerly), against float64 autograd of an
    explicit softmax and logsumexp: a loss of O and L, and the backward called with ``None`` for
    the output a loss does not read (with and without grouped-query attention)."""
    from trainfast.kernels.attention_triton import (
        flash_attention_op_backward,
        flash_attention_op_setup_context,
    )

    _registered_flash_attention_op()
    q, k, v = _qkv((1, 4, 37, 16), (1, n_kv_heads, 45, 16), torch.float32)
    out, lse = torch.ops.trainfast_kernels.flash_attention_forward(q, k, v, is_causal)
    _, expected_out, expected_lse = _explicit_attention64(q, k, v, is_causal)
    torch.testing.assert_close(out.double(), expected_out, atol=2e-5, rtol=2e-5)
    torch.testing.assert_close(lse.double(), expected_lse, atol=2e-5, rtol=2e-5)

    generator = torch.Generator().manual_seed(1)
    grad_out = torch.randn(out.shape, generator=generator)
    grad_lse = torch.randn(lse.shape, generator=generator)
    grads = torch.autograd.grad((out, lse), (q, k, v), (grad_out, grad_lse))
    expected = _expected_grads(q, k, v, is_causal, grad_out, grad_lse)
    for name, grad, reference in zip("qkv", grads, expected, strict=True):
        torch.testing.assert_close(grad.double(), reference, atol=1e-4, rtol=1e-4, msg=name)

    ctx = _OpContext()
    flash_attention_op_setup_context(ctx, (q, k, v, is_causal), (out.detach(), lse.detach()))
    for only_out, only_lse in ((grad_out, None), (None, grad_lse)):
        grads = flash_attention_op_backward(ctx, only_out, only_lse)
        assert grads[3] is None  # is_causal has no gradient
        expected = _expected_grads(q, k, v, is_causal, only_out, only_lse)
        for name, grad, reference in zip("qkv", grads[:3], expected, strict=True):
            torch.testing.assert_close(grad.double(), reference, atol=1e-4, rtol=1e-4, msg=name)


def _op_case(name):
    """(q, k, v) of one bad-input case for the registered operator, float32 on the CPU."""
    q, k, v = (t.detach() for t in _qkv((1, 4, 16, 16), (1, 4, 16, 16), torch.float32))
    if name == "gqa heads":  # 4 query heads on 3 KV heads: 3 does not divide 4
        k, v = k[:, :3], v[:, :3]
    elif name == "more kv heads":
        k, v = torch.cat([k, k[:, :1]], 1), torch.cat([v, v[:, :1]], 1)
    elif name == "head dim":
        q, k, v = (torch.randn(1, 4, 16, 256) for _ in range(3))
    elif name == "dtype":
        q, k, v = (t.double() for t in (q, k, v))
    elif name == "one dtype":
        k = k.half()
    elif name == "device":
        k = k.to("meta")
    elif name == "last-dim stride":  # a transposed view: (16, 16) with strides (1, 16)
        q = q.transpose(-2, -1)
    elif name == "batch":
        k, v = torch.cat([k, k]), torch.cat([v, v])
    elif name == "keys and values":
        v = v[:, :, :8]
    return q, k, v


OP_BAD_INPUTS = {
    "gqa heads": r"q has 4 heads and k 3: the KV heads must divide the query heads",
    "more kv heads": r"q has 4 heads and k 5: the KV heads must divide the query heads",
    "head dim": r"Unsupported head dimension 256 for the Triton kernels \(need 16 to 128\)",
    "dtype": r"Unsupported dtype torch.float64",
    "one dtype": r"q, k, v must share a dtype, got torch.float32, torch.float16",
    "device": r"q, k, v must share a device, got cpu, meta, cpu",
    "last-dim stride": r"q has stride 16 in its last dimension; the operator needs 1",
    "batch": r"q, k, v must have the same leading dimensions, got \(1, 4\), \(2, 4\)",
    "keys and values": r"k has 16 keys but v has 8 values",
}


@pytest.mark.parametrize("case", sorted(OP_BAD_INPUTS))
def test_registered_op_refuses_bad_input_naming_the_value(case):
    """``torch.ops.trainfast_kernels.flash_attention_forward`` checks what it is given. Before it
    did, 4 query heads on 3 KV heads ran with ``group = 4 // 3 = 1`` and read past K and V
    (a finite output, no error), and head dimension 256 compiled."""
    _registered_flash_attention_op()
    q, k, v = _op_case(case)
    with pytest.raises(ValueError, match=OP_BAD_INPUTS[case]):
        torch.ops.trainfast_kernels.flash_attention_forward(q, k, v, False)


def test_registered_backward_op_refuses_tensors_that_do_not_match_the_forward():
    _registered_flash_attention_op()
    q, k, v = (t.detach() for t in _qkv((1, 2, 16, 16), (1, 2, 16, 16), torch.float32))
    out, lse = torch.ops.trainfast_kernels.flash_attention_forward(q, k, v, True)
    backward = torch.ops.trainfast_kernels.flash_attention_backward
    with pytest.raises(ValueError, match=r"grad_out must have q's shape \(1, 2, 16, 16\)"):
        backward(out[..., :8], q, k, v, out, lse, None, True)
    with pytest.raises(ValueError, match=r"lse must have shape \(1, 2, 16\)"):
        backward(out, q, k, v, out, lse[..., :8], None, True)
    with pytest.raises(ValueError, match=r"grad_lse must have shape \(1, 2, 16\)"):
        backward(out, q, k, v, out, lse, lse[0], True)
    with pytest.raises(ValueError, match=r"q has 2 heads and k 3"):
        backward(
            out, q, torch.cat([k, k[:, :1]], 1), torch.cat([v, v[:, :1]], 1), out, lse, None, True
        )


#: the sm_90 launchers' backward tiles at head dimension 128, run here in the interpreter: each
#: tile shape drives both backward kernels (dK/dV: 128 keys a program, 32 queries a step; dQ:
#: 128 queries a program, 32 keys a step, and the reverse)
HOPPER_BACKWARD_TILES = [
    pytest.param((32, 128), id="32x128"),
    pytest.param((128, 32), id="128x32"),
]


@pytest.mark.parametrize("blocks", HOPPER_BACKWARD_TILES)
@pytest.mark.parametrize(
    ("n_queries", "n_keys", "is_causal", "n_kv_heads"),
    [(300, 300, True, 2), (77, 200, False, 1), (200, 77, True, 1)],
)
def test_triton_backward_with_the_hopper_head_dim_128_tiles_matches_float64_autograd(
    blocks, n_queries, n_keys, is_causal, n_kv_heads
):
    """The tiles :func:`attention_dkdv_tiles` and :func:`attention_dq_tiles` pick on an H100 or
    H200 at head dimension 128 (16-bit), here in float32 under the interpreter: several full tiles
    below the diagonal, partial last tiles, more keys than queries and fewer, GQA."""
    from trainfast.gpus import GPUS
    from trainfast.kernels.attention_triton import (
        AttentionTiles,
        attention_dkdv_tiles,
        attention_dq_tiles,
        flash_attention_triton_backward,
        flash_attention_triton_forward,
    )

    h100 = GPUS["H100 SXM 80GB"]
    launched = {
        attention_dkdv_tiles(h100, torch.bfloat16, 128),
        attention_dq_tiles(h100, torch.bfloat16, 128),
    }
    assert {(t.block_q, t.block_k) for t in launched} == {(32, 128), (128, 32)}
    tiles = AttentionTiles(*blocks, num_warps=8, num_stages=3)
    q, k, v = _qkv((1, 2, n_queries, 128), (1, n_kv_heads, n_keys, 128), torch.float32)
    with torch.no_grad():
        out, lse = flash_attention_triton_forward(q, k, v, is_causal, enable_gqa=True)
    grad_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(5))
    grads = flash_attention_triton_backward(grad_out, q, k, v, out, lse, is_causal, tiles)
    expected = _expected_grads(q, k, v, is_causal, grad_out, None)
    for name, grad, reference in zip("qkv", grads, expected, strict=True):
        torch.testing.assert_close(grad.double(), reference, atol=1e-4, rtol=1e-4, msg=name)


def test_triton_backward_names_a_grad_lse_of_the_wrong_shape():
    from trainfast.kernels.attention_triton import (
        flash_attention_triton_backward,
        flash_attention_triton_forward,
    )

    q, k, v = _qkv((1, 2, 16, 16), (1, 2, 16, 16), torch.float32)
    with torch.no_grad():
        out, lse = flash_attention_triton_forward(q, k, v)
    with pytest.raises(ValueError, match=r"grad_lse must have L's shape \(1, 2, 16\)"):
        flash_attention_triton_backward(out, q, k, v, out, lse, grad_lse=torch.zeros(1, 16))


def test_triton_flash_attention_saves_the_same_tensors_as_the_tiled_one():
    q, k, v = _qkv((1, 2, 40, 16), (1, 2, 24, 16), torch.float32)
    triton_out = flash_attention(q, k, v, implementation="triton")
    tiled_out = flash_attention(q, k, v, implementation="tiled")
    q_shape, kv_shape, lse_shape = (1, 2, 40, 16), (1, 2, 24, 16), (1, 2, 40)
    expected = [q_shape, kv_shape, kv_shape, q_shape, lse_shape]  # q, k, v, out, lse
    assert _saved_shapes(triton_out) == _saved_shapes(tiled_out) == expected
    torch.testing.assert_close(
        triton_out.grad_fn.saved_tensors[4], tiled_out.grad_fn.saved_tensors[4]
    )


# --- copy and matmul ------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(0,), (1,), (1000,), (3, 4097), (2, 3, 5, 7)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_copy_kernel_matches_clone(shape, dtype):
    from trainfast.kernels import copy_tensor

    x = torch.randn(shape).to(DEVICE, dtype)
    for block_size in (64, 1024):
        y = copy_tensor(x, block_size=block_size)
        assert torch.equal(y, x.clone()) and y.dtype == x.dtype
        assert x.numel() == 0 or y.data_ptr() != x.data_ptr()
    assert torch.equal(copy_tensor(x, implementation="torch"), x)


# --- fused softmax (Triton's fused-softmax tutorial, one row per program) ---------------------


@pytest.mark.parametrize("shape", [(1, 1), (3, 7), (5, 781), (2, 3, 130), (4, 1024), (2, 2049)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_fused_softmax_matches_torch_softmax(shape, dtype):
    """Rows shorter than, equal to and just past a power of two (the masked lanes), leading
    dimensions viewed as rows, and a 2-D slice whose rows are further apart than their length
    (the kernel's row stride); against torch.softmax in float32."""
    from trainfast.kernels import fused_softmax
    from trainfast.kernels.softmax_triton import SoftmaxTiles

    generator = torch.Generator().manual_seed(0)
    x = (3 * torch.randn(shape, generator=generator)).to(DEVICE, dtype)
    expected = torch.softmax(x.float(), dim=-1)
    y = fused_softmax(x)
    assert y.shape == x.shape and y.dtype == dtype
    torch.testing.assert_close(y.float(), expected, **TOLERANCE[dtype])
    assert torch.equal(fused_softmax(x, implementation="torch"), torch.softmax(x, dim=-1))
    wide = (3 * torch.randn(6, 257, generator=generator)).to(DEVICE, dtype)
    sliced = wide[:, :100]  # rows 257 apart, 100 long
    for tiles in (None, SoftmaxTiles(block_size=512, num_warps=4)):  # a block past the row too
        torch.testing.assert_close(
            fused_softmax(sliced, tiles=tiles).float(),
            torch.softmax(sliced.float(), dim=-1),
            **TOLERANCE[dtype],
        )
    assert fused_softmax(x[:0]).shape == x[:0].shape


@gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_gpu_fused_softmax_matches_torch_softmax(dtype):
    """Compiled, with bfloat16 and the longest row: 16 warps, a 16,384-value block."""
    from trainfast.kernels import fused_softmax
    from trainfast.kernels.softmax_triton import MAX_SOFTMAX_COLUMNS

    generator = torch.Generator().manual_seed(0)
    for shape in ((1823, 781), (64, MAX_SOFTMAX_COLUMNS)):  # the tutorial's unit test, the longest
        x = (3 * torch.randn(shape, generator=generator)).to("cuda", dtype)
        expected = torch.softmax(x.float(), dim=-1)
        torch.testing.assert_close(fused_softmax(x).float(), expected, **TOLERANCE[dtype])


def test_softmax_tiles_hold_the_row_with_the_tutorials_warps():
    """The block is the next power of two at or above the row; 4, 8 or 16 warps; one program
    per row, and the row stride passed."""
    from trainfast.kernels.softmax_triton import softmax_launch, softmax_tiles

    expected = {1: (1, 4), 2: (2, 4), 781: (1024, 4), 1024: (1024, 4), 1025: (2048, 8)}
    expected |= {2049: (4096, 16), 4096: (4096, 16), 16384: (16384, 16)}
    for n_cols, (block, warps) in expected.items():
        tiles = softmax_tiles(None, torch.float32, n_cols)
        assert (tiles.block_size, tiles.num_warps) == (block, warps), n_cols
    x = torch.empty(7, 300, device="meta")[:, :200]
    grid, args, kwargs = softmax_launch(x, torch.empty(7, 200), softmax_tiles(None, x.dtype, 200))
    assert grid == (7,) and args[2:] == (300, 200, 200) and kwargs["BLOCK_SIZE"] == 256


def test_fused_softmax_refuses_what_it_cannot_run_naming_the_value():
    """Each refusal comes before any launch: nothing here runs the kernel."""
    from trainfast.kernels import fused_softmax
    from trainfast.kernels.softmax_triton import (
        MAX_SOFTMAX_COLUMNS,
        SoftmaxTiles,
        softmax_launch,
        softmax_tiles,
    )

    cases = [
        (torch.zeros(2, MAX_SOFTMAX_COLUMNS + 1), {}, "Rows of 16385 values"),
        (torch.zeros(4, 3).t(), {}, r"last dimension contiguous, got shape \(3, 4\)"),
        (torch.zeros(3, 4, 5).transpose(0, 1), {}, r"cannot view shape \(4, 3, 5\)"),
        (torch.tensor(1.0), {}, "0-d tensor"),
        (torch.zeros(2, 3, dtype=torch.float64), {}, "Unsupported dtype torch.float64"),
        (torch.zeros(2, 3), {"implementation": "cuda"}, "Unknown implementation: 'cuda'"),
    ]
    for x, options, message in cases:
        with pytest.raises(ValueError, match=message):
            fused_softmax(x, **options)
    with pytest.raises(ValueError, match="Invalid block_size: 100"):
        SoftmaxTiles(block_size=100)
    with pytest.raises(ValueError, match="Invalid block_size: 64 .rows have 100 values"):
        softmax_launch(torch.empty(2, 100), torch.empty(2, 100), SoftmaxTiles(64))
    with pytest.raises(ValueError, match="Invalid n_cols: 0"):
        softmax_tiles(None, torch.float32, 0)


@pytest.mark.parametrize("mkn", [(33, 47, 65), (64, 64, 64), (1, 17, 5), (100, 16, 3)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_tiled_matmul_matches_torch_matmul(mkn, dtype):
    from trainfast.kernels import matmul

    m, k, n = mkn
    generator = torch.Generator().manual_seed(1)
    a = torch.randn(m, k, generator=generator).to(DEVICE, dtype)
    b = torch.randn(k, n, generator=generator).to(DEVICE, dtype)
    expected = a.double() @ b.double()
    tolerance = TOLERANCE[dtype]
    torch.testing.assert_close(
        matmul(a, b).double(), expected, atol=tolerance["atol"] * k**0.5 * 2, rtol=tolerance["rtol"]
    )
    # strided input without a copy: b.T of a (n, k) matrix
    torch.testing.assert_close(
        matmul(a, b.T.contiguous().T).double(),
        expected,
        atol=tolerance["atol"] * k**0.5 * 2,
        rtol=tolerance["rtol"],
    )
    torch.testing.assert_close(matmul(a, b, implementation="torch"), torch.matmul(a, b))


def test_tile_traffic_shrinks_with_bigger_tiles():
    from trainfast.kernels.tiled_matmul import MatmulTiles, tile_traffic_bytes

    small = tile_traffic_bytes(4096, 4096, 4096, MatmulTiles(32, 32, 32), element_bytes=2)
    large = tile_traffic_bytes(4096, 4096, 4096, MatmulTiles(128, 256, 64), element_bytes=2)
    # 32×32 tiles: every program reads (32 + 32)·K elements; 128×256: (128 + 256)·K for 32x the area
    assert small == (128 * 128 * 64 * 4096 + 4096 * 4096) * 2
    assert large == (32 * 16 * 384 * 4096 + 4096 * 4096) * 2
    assert small / large > 5


@pytest.mark.parametrize("mkn", [(37, 19, 53), (33, 70, 31), (1, 5, 3)])
@pytest.mark.parametrize("has_bias", [True, False])
def test_matmul_bias_gelu_epilogue_matches_torch(mkn, has_bias):
    """The fused epilogue (interpreted on a CPU) against gelu(a @ b + bias, approximate="tanh")."""
    from trainfast.kernels.tiled_matmul import matmul, matmul_reference

    m, k, n = mkn
    generator = torch.Generator().manual_seed(2)
    a = torch.randn(m, k, generator=generator).to(DEVICE)
    b = torch.randn(k, n, generator=generator).to(DEVICE)
    bias = torch.randn(n, generator=generator).to(DEVICE) if has_bias else None
    linear = a.double() @ b.double() + (0 if bias is None else bias.double())
    expected = F.gelu(linear, approximate="tanh")
    atol, rtol = 2e-5 * k**0.5 * 2, 2e-5
    fused = matmul(a, b, bias, "gelu_tanh")
    torch.testing.assert_close(fused.double(), expected, atol=atol, rtol=rtol)
    # bias alone, and the reference path behind the same signature
    torch.testing.assert_close(matmul(a, b, bias).double(), linear, atol=atol, rtol=rtol)
    reference = matmul(a, b, bias, "gelu_tanh", implementation="torch")
    torch.testing.assert_close(reference, matmul_reference(a, b, bias, "gelu_tanh"))
    torch.testing.assert_close(reference.double(), expected, atol=atol, rtol=rtol)
    # "autotune" under the interpreter times nothing and uses the fixed tiles
    torch.testing.assert_close(matmul(a, b, bias, "gelu_tanh", tiles="autotune"), fused)


def test_matmul_epilogue_rejects_bad_input_and_never_tunes_interpreted():
    from trainfast.kernels.tiled_matmul import (
        matmul,
        matmul_tile_candidates,
        matmul_tiles,
        tune_matmul_tiles,
    )

    a, b = torch.randn(4, 3), torch.randn(3, 5)
    with pytest.raises(ValueError, match="Unknown activation: 'relu'"):
        matmul(a, b, activation="relu")
    with pytest.raises(ValueError, match=r"bias must have shape \(5,\).*got \(4,\)"):
        matmul(a, b, torch.randn(4))
    assert tune_matmul_tiles(a, b, None, "gelu_tanh") == matmul_tiles(None, torch.float32)
    assert matmul_tile_candidates(None, torch.float32) == [matmul_tiles(None, torch.float32)]


def test_matmul_tiles_is_the_first_candidate_and_candidates_respect_the_budget():
    from trainfast.gpus import GPUS
    from trainfast.kernels.tiled_matmul import matmul_tile_candidates, matmul_tiles

    for gpu in GPUS.values():
        for dtype in (torch.float16, torch.float32):
            candidates = matmul_tile_candidates(gpu, dtype)
            assert candidates and matmul_tiles(gpu, dtype) == candidates[0]
            element = torch.empty((), dtype=dtype).element_size()
            budget = gpu.shared_memory_per_block_bytes  # the compile report checks the real use
            assert all(t.shared_memory_bytes(element) <= budget for t in candidates), gpu.name


def test_epilogue_traffic_counts_the_four_extra_passes():
    from trainfast.kernels.tiled_matmul import epilogue_traffic_bytes

    m, n, k = 8192, 4 * 1024, 1024  # tokens × MLP width × model width
    fused = epilogue_traffic_bytes(m, n, k, 2, fused=True)
    unfused = epilogue_traffic_bytes(m, n, k, 2, fused=False)
    assert fused == (m * k + k * n + n + m * n) * 2
    assert unfused - fused == 4 * m * n * 2  # bias add: read + write C; GELU: read + write
    no_bias = epilogue_traffic_bytes(m, n, k, 2, has_bias=False, fused=False)
    assert no_bias - epilogue_traffic_bytes(m, n, k, 2, has_bias=False, fused=True) == 2 * m * n * 2
    with pytest.raises(ValueError, match="Invalid k: 0"):
        epilogue_traffic_bytes(m, n, 0, 2, fused=True)


# --- bad input --------------------------------------------------------------------------------


def _bad_attention_inputs():
    q = torch.randn(2, 8, 16)
    return [
        (
            (q, torch.randn(2, 8, 32), torch.randn(2, 8, 32)),
            r"Mismatched head dimensions: q 16, k 32, v 32",
        ),
        (
            (q, torch.randn(3, 8, 16), torch.randn(3, 8, 16)),
            r"same leading dimensions.*\(2,\).*\(3,\)",
        ),
        ((q, torch.randn(2, 8, 16), torch.randn(2, 9, 16)), r"k has 8 keys but v has 9 values"),
        ((q.int(), q.int(), q.int()), r"Unsupported dtype for q: torch.int32"),
        ((q, q.double(), q), r"must share a dtype"),
        ((torch.randn(16), q, q), r"q must be \(\.\.\., sequence, head_dim\), got shape \(16,\)"),
        ((torch.randn(2, 0, 16), q, q), r"at least one query and one key, got 0 and 8"),
    ]


@pytest.mark.parametrize("implementation", ["tiled", "triton"])
def test_attention_rejects_bad_input_naming_the_problem(implementation):
    for args, message in _bad_attention_inputs():
        with pytest.raises(ValueError, match=message):
            flash_attention(*args, implementation=implementation)
    with pytest.raises(ValueError, match="Unknown implementation: 'cuda'"):
        flash_attention(*_bad_attention_inputs()[0][0][:1] * 3, implementation="cuda")


def test_triton_kernels_reject_what_they_cannot_run():
    from trainfast.kernels import copy_tensor, matmul
    from trainfast.kernels.tiled_matmul import MatmulTiles

    def randn(*shape, dtype=torch.float32):
        return torch.randn(*shape, device=DEVICE, dtype=dtype)

    q = randn(1, 8, 256)
    with pytest.raises(ValueError, match=r"head dimension 256.*16 to 128.*implementation='tiled'"):
        flash_attention(q, q, q, implementation="triton")
    q = randn(1, 8, 8)
    with pytest.raises(ValueError, match=r"head dimension 8"):
        flash_attention(q, q, q, implementation="triton")
    with pytest.raises(ValueError, match=r"needs a contiguous tensor.*strides \(1, 5\)"):
        copy_tensor(randn(3, 5).T)
    with pytest.raises(ValueError, match=r"Invalid block_size: 100"):
        copy_tensor(randn(5), block_size=100)
    with pytest.raises(ValueError, match=r"Inner dimensions differ.*\(3, 4\).*\(5, 6\)"):
        matmul(randn(3, 4), randn(5, 6))
    with pytest.raises(ValueError, match=r"Invalid block_k: 24"):
        MatmulTiles(64, 64, 24)
    with pytest.raises(ValueError, match=r"one dtype"):
        matmul(randn(4, 4), randn(4, 4, dtype=torch.float16))
    with pytest.raises(ValueError, match=r"Unsupported dtype torch.float64"):
        matmul(randn(4, 4, dtype=torch.float64), randn(4, 4, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"one device"):
        matmul(randn(4, 4), torch.randn(4, 4, device="meta"))


@pytest.mark.skipif(CUDA, reason="the interpreter's refusal of bfloat16; GPUs run it")
def test_interpreter_refuses_bfloat16_clearly():
    from trainfast.kernels import copy_tensor, matmul

    x = torch.randn(32, 32, dtype=torch.bfloat16)
    q = x[None]
    calls = [
        lambda: copy_tensor(x),
        lambda: matmul(x, x),
        lambda: flash_attention(q, q, q, implementation="triton"),
    ]
    message = (
        r"torch.bfloat16 in Triton's interpreter \(the interpreter computes bfloat16 wrongly\)"
    )
    for call in calls:
        with pytest.raises(ValueError, match=message):
            call()


# --- how Triton is loaded: the interpreter, and what happens when it cannot be used ----------


def _run_python(code: str, **env: str) -> subprocess.CompletedProcess:
    environment = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    environment.update(env)
    command = [sys.executable, "-c", textwrap.dedent(code)]
    return subprocess.run(command, capture_output=True, text=True, env=environment, timeout=300)


def test_import_trainfast_kernels_needs_no_triton_and_sets_nothing():
    result = _run_python("""
        import os, sys
        sys.modules["triton"] = None  # as if triton were not installed
        import trainfast.kernels as kernels
        print(os.environ.get("TRITON_INTERPRET"), callable(kernels.flash_attention))
        try:
            kernels.copy_tensor
        except ImportError as error:
            print("ImportError:", error)
    """)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "None True"
    assert "need the `triton` package" in lines[1]


@pytest.mark.skipif(CUDA, reason="CPU-only behaviour")
def test_interpreter_works_even_after_torch_imported_triton():
    """FlopCounterMode (and torch.compile) import triton before TRITON_INTERPRET is set; its
    standard library (tl.cdiv, tl.max, tl.sum) is then compiled-only, and the runtime imports
    Triton afresh so that our kernels, which call it, still run in the interpreter."""
    result = _run_python("""
        import os, sys, torch
        from torch.utils.flop_counter import FlopCounterMode  # imports triton (recent torch)
        import triton  # as recent torch does above; torch 2.4 did not
        assert "triton" in sys.modules and "TRITON_INTERPRET" not in os.environ
        from trainfast.kernels import flash_attention, matmul
        from trainfast.kernels.triton_runtime import interpreter_repaired
        a, b = torch.randn(40, 30), torch.randn(30, 20)
        q = torch.randn(1, 2, 20, 16)
        expected = torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)
        attended = flash_attention(q, q, q, True, implementation="triton")
        print(os.environ["TRITON_INTERPRET"], interpreter_repaired(),
              torch.allclose(matmul(a, b), a @ b, atol=1e-5),
              torch.allclose(attended, expected, atol=1e-5))
    """)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["1", "True", "True", "True"]


@pytest.mark.skipif(CUDA, reason="CPU-only behaviour")
def test_cpu_tensors_with_compiled_kernels_fail_with_a_clear_error():
    result = _run_python(
        """
        import torch
        from trainfast.kernels import copy_tensor
        try:
            copy_tensor(torch.randn(10))
        except ValueError as error:
            print(error)
    """,
        TRITON_INTERPRET="0",
    )
    assert result.returncode == 0, result.stderr
    assert "need Triton's interpreter" in result.stdout and "TRITON_INTERPRET=1" in result.stdout


# --- the C++ operator -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cpp_op():
    from trainfast.kernels.custom_ops import load_bias_gelu

    return load_bias_gelu("cpu")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_cpp_bias_gelu_matches_reference(cpp_op, dtype):
    x = torch.randn(3, 5, 70, dtype=dtype, requires_grad=True)
    bias = torch.randn(70, dtype=dtype, requires_grad=True)
    out = bias_gelu(x, bias)
    expected = bias_gelu_reference(x, bias)
    torch.testing.assert_close(out, expected)
    grad = torch.randn_like(out)
    torch.testing.assert_close(
        torch.autograd.grad(out, (x, bias), grad), torch.autograd.grad(expected, (x, bias), grad)
    )


def test_cpp_bias_gelu_gradcheck_and_opcheck(cpp_op):
    x = torch.randn(4, 6, dtype=torch.float64, requires_grad=True)
    bias = torch.randn(6, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(bias_gelu, (x, bias))
    # fake tensor, schema, autograd registration and AOT dispatch checks of torch.library
    torch.library.opcheck(torch.ops.trainfast_kernels.bias_gelu.default, (x, bias))
    torch.library.opcheck(
        torch.ops.trainfast_kernels.bias_gelu.default, (x.detach().float(), bias.detach().float())
    )


def test_cpp_bias_gelu_under_torch_compile(cpp_op):
    """Dynamo traces through the op with its fake implementation, in one graph (no breaks).

    The ``aot_eager`` backend runs AOTAutograd (forward and backward graphs, from the fake and
    autograd registrations) without inductor's code generation, which costs ~40 s on this CPU.
    """
    torch._dynamo.reset()

    def block(x, bias):
        return bias_gelu(x, bias) * 2.0

    compiled = torch.compile(block, fullgraph=True, backend="aot_eager")
    x = torch.randn(8, 16, requires_grad=True)
    bias = torch.randn(16, requires_grad=True)
    out = compiled(x, bias)
    torch.testing.assert_close(out, 2 * bias_gelu_reference(x, bias))
    out.sum().backward()
    expected = torch.autograd.grad(block(x, bias).sum(), x)[0]
    torch.testing.assert_close(x.grad, expected)


def test_cpp_bias_gelu_rejects_bad_input():
    x = torch.randn(4, 6)
    bad = [
        (
            (x, torch.randn(5)),
            r"bias must be 1-D with x's last dimension, got x \(4, 6\), bias \(5,\)",
        ),
        ((x, torch.randn(6, dtype=torch.float64)), r"share device and dtype"),
        ((x.half(), torch.randn(6).half()), r"Unsupported dtype torch.float16 on cpu"),
        ((torch.randn(6, 4).T, torch.randn(6)), r"must be contiguous"),
    ]
    for args, message in bad:
        with pytest.raises(ValueError, match=message):
            bias_gelu(*args)
    with pytest.raises(ValueError, match="Unknown implementation: 'cuda'"):
        bias_gelu(x, torch.randn(6), implementation="cuda")


def test_cpp_build_is_cached_across_processes(cpp_op):
    """A fresh process finds the compiled library in the cache and does not compile again."""
    from trainfast.kernels.custom_ops import build_in_subprocess

    warm = build_in_subprocess()
    assert not warm.compiled, f"rebuilt instead of loading from {warm.directory}"
    assert warm.directory == cpp_op.directory and os.path.isdir(warm.directory)


# --- on a GPU ---------------------------------------------------------------------------------


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize(
    "shape", [(300, 300, 64), (128, 700, 128), (700, 128, 96), (1024, 1024, 16)]
)
def test_gpu_triton_flash_attention_matches_sdpa(shape, dtype, is_causal):
    from trainfast.kernels import FlashAttentionTriton

    n_queries, n_keys, head_dim = shape
    q, k, v = _qkv((2, 4, n_queries, head_dim), (2, 4, n_keys, head_dim), dtype, device="cuda")
    _assert_matches_sdpa(FlashAttentionTriton.apply, q, k, v, is_causal, dtype)


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_gpu_tiled_flash_attention_matches_sdpa(dtype):
    q, k, v = _qkv((2, 4, 200, 64), (2, 4, 300, 64), dtype, device="cuda")
    _assert_matches_sdpa(flash_attention, q, k, v, True, dtype)


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_gpu_matmul_and_copy_match_torch(dtype):
    from trainfast.kernels import copy_tensor, matmul
    from trainfast.kernels.tiled_matmul import MatmulTiles

    a = torch.randn(1000, 700, device="cuda", dtype=dtype)
    b = torch.randn(700, 1200, device="cuda", dtype=dtype)
    expected = a.double() @ b.double()
    atol = TOLERANCE[dtype]["atol"] * 700**0.5 * 4
    for tiles in (None, MatmulTiles(64, 64, 32, num_warps=4, num_stages=4)):
        torch.testing.assert_close(
            matmul(a, b, tiles=tiles).double(), expected, atol=atol, rtol=TOLERANCE[dtype]["rtol"]
        )
    x = torch.randn(10_000_019, device="cuda", dtype=dtype)
    assert torch.equal(copy_tensor(x, block_size=4096, num_warps=8), x)


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_gpu_matmul_epilogue_matches_torch_and_cublaslt(dtype):
    from trainfast.kernels.tiled_matmul import matmul

    generator = torch.Generator().manual_seed(3)
    a = (torch.randn(1000, 700, generator=generator) / 700**0.5).to("cuda", dtype)
    b = torch.randn(700, 1200, generator=generator).to("cuda", dtype)
    bias = torch.randn(1200, generator=generator).to("cuda", dtype)
    expected = F.gelu(a.double() @ b.double() + bias.double(), approximate="tanh")
    atol, rtol = TOLERANCE[dtype]["atol"] * 4, TOLERANCE[dtype]["rtol"] * 2
    for tiles in (None, "autotune"):
        fused = matmul(a, b, bias, "gelu_tanh", tiles=tiles)
        torch.testing.assert_close(fused.double(), expected, atol=atol, rtol=rtol)
    if dtype != torch.float32:  # cuBLASLt's fused GELU epilogue computes the same function
        cublaslt = torch._addmm_activation(bias, a, b, use_gelu=True)
        torch.testing.assert_close(cublaslt.double(), expected, atol=atol, rtol=rtol)


@pytest.mark.gpu
@gpu
def test_gpu_compiled_kernels_refuse_cpu_tensors():
    from trainfast.kernels import copy_tensor

    with pytest.raises(ValueError, match="need Triton's interpreter"):
        copy_tensor(torch.randn(10))


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32, torch.float64])
def test_gpu_cuda_bias_gelu_matches_reference(dtype):
    from torch.utils.cpp_extension import CUDA_HOME
    from trainfast.kernels.custom_ops import load_bias_gelu

    if CUDA_HOME is None:
        pytest.skip("no CUDA toolkit (nvcc) to compile the CUDA operator")
    load_bias_gelu("cuda")
    x = torch.randn(64, 1000, device="cuda", dtype=dtype, requires_grad=True)
    bias = torch.randn(1000, device="cuda", dtype=dtype, requires_grad=True)
    out = bias_gelu(x, bias)
    expected = bias_gelu_reference(x.double(), bias.double())
    tolerance = TOLERANCE[dtype]
    torch.testing.assert_close(out.double(), expected, **tolerance)
    grad = torch.randn_like(out)
    got = torch.autograd.grad(out, (x, bias), grad)
    want = torch.autograd.grad(bias_gelu_reference(x, bias), (x, bias), grad)
    torch.testing.assert_close(got[0].double(), want[0].double(), **tolerance)
    torch.testing.assert_close(
        got[1].double(), want[1].double(), atol=tolerance["atol"] * 64, rtol=tolerance["rtol"] * 8
    )
    if dtype == torch.float64:
        torch.library.opcheck(torch.ops.trainfast_kernels.bias_gelu.default, (x, bias))


# --- the roofline, bandwidth, the allocator, checkpointing -----------------------------------


def test_roofline_arithmetic():
    from trainfast.kernels.roofline import Roofline, elementwise_cost, matmul_cost, reduction_cost

    roofline = Roofline(peak_flops=1000.0, bytes_per_s=100.0)
    assert roofline.ridge == 10.0
    assert roofline.attainable(2.0) == 200.0 and roofline.attainable(50.0) == 1000.0
    assert roofline.bound(9.9) == "memory" and roofline.bound(10.0) == "compute"
    assert elementwise_cost("add", 1000, inputs=2).intensity == pytest.approx(1 / 12)
    assert reduction_cost("sum", 1001).bytes == 1002 * 4
    square = matmul_cost(4096, 4096, 4096, element_bytes=2)
    assert square.flops == 2 * 4096**3 and square.intensity == pytest.approx(4096 / 3)
    with pytest.raises(ValueError, match="Invalid peak_flops: 0.0"):
        Roofline(0.0, 1.0)


def test_measured_roofline_rows_and_the_roofline_taken_from_them():
    from trainfast.kernels.roofline import measure_roofline, roofline_from_rows

    rows = measure_roofline(torch.device("cpu"), n=1 << 16, matmul_sizes=(64,), repeats=2)
    assert [r["operation"] for r in rows] == [
        "copy",
        "x + y",
        "sum(x)",
        "matrix-vector 256x256",
        "matmul 64x64x64",
    ]
    assert all(r["seconds"] > 0 and r["flops_per_s"] == r["flops"] / r["seconds"] for r in rows)
    assert rows[-1]["intensity"] == pytest.approx(2 * 64**3 / (3 * 64 * 64 * 4))
    # the ceilings: the fastest matmul and the copy (timings are noisy here, the rule is not)
    speeds = [0.0, 5.0, 6.0, 7.0, 90.0]
    bandwidths = [40.0, 30.0, 20.0, 10.0, 1.0]
    synthetic = [
        dict(r, flops_per_s=speed, bytes_per_s=bandwidth)
        for r, speed, bandwidth in zip(rows, speeds, bandwidths, strict=True)
    ]
    roofline = roofline_from_rows(synthetic)
    assert (roofline.peak_flops, roofline.bytes_per_s) == (90.0, 40.0)
    with pytest.raises(ValueError, match="No 'copy' row"):
        roofline_from_rows(synthetic[1:])


def test_bandwidth_measurements_return_rows():
    from trainfast.kernels.bandwidth import (
        cache_sizes,
        copy_bandwidth,
        host_transfer_costs,
        strided_bandwidth,
    )

    copies = copy_bandwidth(torch.device("cpu"), [4096, 1 << 20])
    assert [r["bytes"] for r in copies] == [4096, 1 << 20] and all(
        r["gb_per_s"] > 0 for r in copies
    )
    strided = strided_bandwidth(torch.device("cpu"), [1, 4, 64], n=1 << 12, repeats=2)
    assert {r["buffer_bytes"] for r in strided} == {1 << 14}  # one buffer at every stride
    line = strided[0]["unit_bytes"]
    assert [r["pass_bytes"] for r in strided] == [1 << 14, 1 << 14, line * (1 << 12) // 64]
    assert all(r["seconds_min"] <= r["seconds"] <= r["seconds_max"] for r in strided)
    host = host_transfer_costs(torch.device("cpu"))
    assert [r["operation"] for r in host] == ["100 x sum(), one sync", "100 x sum() + .item()"]
    assert all(isinstance(size, int) and size > 0 for size in cache_sizes().values())


def test_strided_order_reads_every_element_once_in_stride_passes():
    from trainfast.kernels.bandwidth import cache_line_bytes, strided_order

    assert strided_order(8, 2).tolist() == [0, 2, 4, 6, 1, 3, 5, 7]
    for stride in (1, 4, 64):
        order = strided_order(1 << 10, stride)
        assert order.dtype == torch.int32 and sorted(order.tolist()) == list(range(1 << 10))
        first_pass = torch.arange(0, 1 << 10, stride, dtype=torch.int32)
        assert torch.equal(order[: (1 << 10) // stride], first_pass)
    with pytest.raises(ValueError, match="stride"):
        strided_order(10, 4)
    line = cache_line_bytes()
    assert line is None or (line > 0 and line & (line - 1) == 0)  # a power of two


def test_cpu_peak_reads_clock_and_vector_width():
    from trainfast.kernels.roofline import cpu_peak_flops

    info = "cpu MHz\t\t: 2000.000\nflags\t\t: fpu sse2 avx avx2 fma\n"
    peak = cpu_peak_flops(2, cpuinfo=info)
    assert (peak.isa, peak.lanes, peak.flops_per_cycle) == ("AVX2 + FMA", 8, 32)
    assert peak.peak_flops == 2 * 2e9 * 32
    assert cpu_peak_flops(1, cpuinfo=info.replace("avx2 fma", "avx2 fma avx512f")).lanes == 16
    assert cpu_peak_flops(1, cpuinfo="cpu MHz : 1000\nflags : sse2\n").flops_per_cycle == 8


@pytest.mark.parametrize(
    ("vendor", "family", "model", "flags", "microarchitecture", "flops_per_cycle"),
    [
        # Zen 4 runs AVX-512 on two 256-bit FMA pipes: 2 x 8 lanes x 2 = 32, not 64
        ("AuthenticAMD", 25, 17, "avx2 fma avx512f", "Zen 4", 32),
        ("AuthenticAMD", 25, 1, "avx2 fma", "Zen 3", 32),
        ("AuthenticAMD", 26, 2, "avx2 fma avx512f", "Zen 5", 64),
        # model ranges as Linux assigns them: family 23 model 0x50 is Zen (128-bit), not Zen 2
        ("AuthenticAMD", 23, 0x50, "avx2 fma", "Zen / Zen+", 16),
        ("AuthenticAMD", 23, 0x71, "avx2 fma", "Zen 2", 32),
        ("AuthenticAMD", 25, 0x21, "avx2 fma", "Zen 3", 32),
        # Sapphire Rapids: two 512-bit FMA units, 2 x 16 lanes x 2 = 64
        ("GenuineIntel", 6, 143, "avx2 fma avx512f", "Sapphire Rapids", 64),
    ],
)
def test_cpu_peak_follows_the_microarchitecture(
    vendor, family, model, flags, microarchitecture, flops_per_cycle
):
    from trainfast.kernels.roofline import cpu_peak_flops

    info = (
        f"vendor_id\t: {vendor}\ncpu family\t: {family}\nmodel\t\t: {model}\n"
        f"cpu MHz\t\t: 2000.000\nflags\t\t: fpu sse2 avx {flags}\n"
    )
    peak = cpu_peak_flops(1, cpuinfo=info)
    assert (peak.microarchitecture, peak.flops_per_cycle) == (microarchitecture, flops_per_cycle)


def test_a_turbo_clock_can_beat_the_nominal_clock_peak():
    """A measurement above the nominal-clock peak implies a clock above the nominal one."""
    from trainfast.kernels.roofline import cpu_peak_flops

    info = (
        "vendor_id : AuthenticAMD\ncpu family : 25\nmodel : 17\ncpu MHz : 2450.0\n"
        "flags : avx2 fma avx512f\n"
    )
    peak = cpu_peak_flops(1, cpuinfo=info)
    measured = 1.16 * peak.peak_flops  # the build's matmul: 116 % of the nominal-clock peak
    assert peak.implied_clock_hz(measured) == pytest.approx(1.16 * 2.45e9)
    assert peak.implied_clock_hz(peak.peak_flops) == pytest.approx(peak.clock_hz)
    with pytest.raises(ValueError, match="threads"):
        cpu_peak_flops(0, cpuinfo=info)
    with pytest.raises(ValueError, match="cpuinfo"):
        cpu_peak_flops(1, cpuinfo="model name : none\n")


@pytest.mark.parametrize(
    ("gpu", "threads", "registers", "shared", "blocks", "limit"),
    [
        # cc 7.5: shared memory in 256-byte units, 10,800 -> 11,008 B; 65,536 // 11,008 = 5
        # (128-byte units would give 10,880 B and 6 blocks)
        ("T4 16GB", 128, 32, 10_800, 5, "shared memory"),
        # 200 registers x 32 = 6,400 per warp; each of 4 sub-partitions holds 16,384 // 6,400 = 2
        # warps: 8 warps, 8 one-warp blocks (65,536 // 6,400 = 10 without the sub-partitions)
        ("H100 SXM 80GB", 32, 200, 0, 8, "registers"),
        # 4 x (16,384 // 2,048) = 32 warps by registers; shared 49,152 + 1,024 reserved = 50,176
        # (a multiple of 128): 167,936 // 50,176 = 3 blocks
        ("A100 SXM 80GB", 128, 64, 48 * 1024, 3, "shared memory"),
        # 32 warps x 2,304 registers = 73,728 > 65,536 per block: the hardware check fails
        ("H100 SXM 80GB", 1024, 72, 0, 0, "registers"),
        # 32 warps x 2,048 = 65,536 fits; 4 x (16,384 // 2,048) = 32 warps: one block (threads: 2)
        ("H100 SXM 80GB", 1024, 64, 0, 1, "registers"),
    ],
)
def test_occupancy_matches_cases_worked_from_cuda_occupancy_h(
    gpu, threads, registers, shared, blocks, limit
):
    """Cases worked by hand from cuda_occupancy.h's cudaOccMaxActiveBlocksPerMultiprocessor
    (register sub-partitions, per-warp allocation units, 256-byte shared units on cc 7.x)."""
    from trainfast.gpus import GPUS
    from trainfast.kernels.occupancy import occupancy

    result = occupancy(
        GPUS[gpu],
        threads_per_block=threads,
        registers_per_thread=registers,
        shared_memory_per_block=shared,
    )
    assert (result.blocks_per_sm, result.limit) == (blocks, limit)


def test_occupancy_names_the_limiting_resource():
    from trainfast.gpus import GPUS
    from trainfast.kernels.occupancy import (
        HOPPER_LATENCY_CYCLES,
        bytes_in_flight,
        occupancy,
        sm_clock_hz,
    )

    h100, t4 = GPUS["H100 SXM 80GB"], GPUS["T4 16GB"]
    full = occupancy(h100, threads_per_block=256, registers_per_thread=32)
    assert (full.blocks_per_sm, full.warps_per_sm, full.fraction) == (8, 64, 1.0)
    assert full.limit == "threads and registers"  # both allow 8 blocks: both are named
    heavy = occupancy(h100, threads_per_block=128, registers_per_thread=255)  # 8,192 per warp
    assert (heavy.blocks_per_sm, heavy.warps_per_sm, heavy.limit) == (2, 8, "registers")
    big = {
        "threads_per_block": 128,
        "registers_per_thread": 32,
        "shared_memory_per_block": 100 << 10,
    }
    smem = occupancy(h100, **big)
    assert (smem.blocks_per_sm, smem.limit) == (2, "shared memory")  # 228 KiB / (100 + 1) KiB
    tiny = occupancy(h100, threads_per_block=32, registers_per_thread=16)
    assert (tiny.blocks_per_sm, tiny.limit) == (32, "blocks")
    assert occupancy(t4, threads_per_block=256, registers_per_thread=32).warps_per_sm == 32
    over = occupancy(t4, **big)  # over the T4's 64 KiB per block: it cannot launch
    assert (over.blocks_per_sm, over.limit) == (0, "shared memory")
    with pytest.raises(ValueError, match="registers_per_thread"):
        occupancy(h100, threads_per_block=128, registers_per_thread=256)
    assert bytes_in_flight(2e12, 500e-9) == pytest.approx(1e6)
    latencies = [HOPPER_LATENCY_CYCLES[k] for k in ("shared memory", "L1 cache", "L2 cache", "HBM")]
    assert latencies == sorted(latencies)  # each level further out answers later
    assert sm_clock_hz(h100, 128) == pytest.approx(1.98e9, rel=1e-3)  # the H100 SXM's boost clock


def test_rms_norm_dispatches_six_operations_and_eager_saves_about_twice_the_bytes():
    from trainfast.accounting import saved_tensor_bytes
    from trainfast.kernels.fusion import dispatched_operations, rms_norm

    x = torch.randn(8, 16, requires_grad=True)
    weight = torch.randn(16, requires_grad=True)
    reference = torch.nn.functional.rms_norm(x, (16,), weight, eps=1e-6)
    torch.testing.assert_close(rms_norm(x, weight), reference, rtol=1e-5, atol=1e-6)
    operations = dispatched_operations(rms_norm, x, weight)
    assert [op.split(".")[1] for op in operations] == ["pow", "mean", "add", "rsqrt", "mul", "mul"]
    # distinct storages: x, 1/rms, x/rms, w (x and 1/rms are each saved twice)
    assert saved_tensor_bytes(lambda: rms_norm(x, weight)) == 4 * (2 * 8 * 16 + 8 + 16)


ALLOCATOR_CASES = [  # (request, block, segment) on an empty cache, from CUDACachingAllocator.cpp
    (0, 0, 0),
    (1, 512, 2 << 20),
    (512, 512, 2 << 20),
    (513, 1024, 2 << 20),
    (1 << 20, 1 << 20, 2 << 20),  # small pool: split, 1 MiB >= 512 bytes left
    ((1 << 20) + 1, (1 << 20) + 512, 20 << 20),
    ((10 << 20) - 1, 10 << 20, 10 << 20),
    (10 << 20, 10 << 20, 10 << 20),
    ((10 << 20) + 1, (10 << 20) + 512, 12 << 20),  # split: 2 MiB - 512 bytes left
    ((11 << 20) - 512, (11 << 20) - 512, 12 << 20),  # split: 1 MiB + 512 bytes left
    (11 << 20, 12 << 20, 12 << 20),  # not split: exactly 1 MiB would be left
    (50_000_000, 24 * (2 << 20), 24 * (2 << 20)),  # not split: 331,264 bytes would be left
]


def test_allocator_rounding_rules():
    from trainfast.kernels.allocator import block_bytes, rounded_bytes, segment_bytes

    for nbytes, block, segment in ALLOCATOR_CASES:
        assert (block_bytes(nbytes), segment_bytes(nbytes)) == (block, segment), nbytes
    assert rounded_bytes(50_000_000) == 50_000_384 and rounded_bytes(513) == 1024
    for function in (block_bytes, rounded_bytes, segment_bytes):
        with pytest.raises(ValueError, match="Invalid nbytes: -1"):
            function(-1)


def test_a_new_large_segment_is_split_only_if_more_than_1_mib_would_be_left():
    """should_split: a large-pool block (a new segment too) is split only when more than
    kSmallSize (1 MiB) would remain; otherwise the request occupies, and memory_allocated
    counts, the whole segment."""
    from trainfast.kernels.allocator import (
        K_SMALL_SIZE,
        block_bytes,
        cached_block_use,
        rounded_bytes,
        segment_bytes,
    )

    for nbytes in (50_000_000, 11 << 20, (11 << 20) - 512, (10 << 20) + 1, 5 << 20, 100 << 20):
        left = segment_bytes(nbytes) - rounded_bytes(nbytes)
        expected = rounded_bytes(nbytes) if left > K_SMALL_SIZE else segment_bytes(nbytes)
        assert block_bytes(nbytes) == expected, nbytes
        assert cached_block_use(nbytes, segment_bytes(nbytes), pool="large") == expected, nbytes
    assert block_bytes(50_000_000) == 50_331_648  # the H100's memory_allocated, not 50,000,384
    assert block_bytes((10 << 20) + 1) == (10 << 20) + 512  # 2 MiB - 512 bytes left: split


def test_allocator_model_matches_every_measured_record():
    """The model against the caching allocator's own numbers: each GPU record's allocated and
    reserved bytes for one request on an empty cache."""
    from trainfast.kernels.allocator import block_bytes, segment_bytes
    from trainfast.records import records_for

    records = records_for("caching-allocator", "cuda")
    if not records:
        pytest.skip("no caching-allocator record from a CUDA device in book/records")
    for record in records:
        for row in record.rows:
            nbytes = row["requested_bytes"]
            measured = (row["allocated_bytes"], row["reserved_bytes"])
            assert (block_bytes(nbytes), segment_bytes(nbytes)) == measured, (
                record.device_name,
                row,
            )


def test_expandable_segments_switch_uses_the_setter_torch_does_not_deprecate(monkeypatch):
    import warnings

    from trainfast.kernels import allocator

    if not hasattr(torch._C, "_accelerator_setAllocatorSettings"):
        pytest.skip(f"torch {torch.__version__} has only torch.cuda.memory's setter")
    settings = []
    monkeypatch.setattr(torch._C, "_accelerator_setAllocatorSettings", settings.append)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torch.cuda.memory._set_allocator_settings warns
        allocator._set_expandable_segments(True)
        allocator._set_expandable_segments(False)
    assert settings == ["expandable_segments:True", "expandable_segments:False"]


def _fake_snapshot():
    """A snapshot shaped like torch.cuda.memory._snapshot()'s: one 2 MiB segment, two blocks."""
    frame = {"filename": "/long/path/to/train.py", "line": 7, "name": "step"}
    cpp = {"filename": "c10/cuda/CUDACachingAllocator.cpp", "line": 1, "name": "malloc"}
    base = 1 << 30  # the segment's address
    used = {
        "address": base,
        "size": 1024,
        "requested_size": 1000,
        "state": "active_allocated",
        "frames": [cpp, frame, frame],
    }
    free = {
        "address": base + 1024,
        "size": (2 << 20) - 1024,
        "requested_size": 0,
        "state": "inactive",
        "frames": [],
    }
    segment = {
        "device": 0,
        "address": base,
        "total_size": 2 << 20,
        "stream": 0,
        "segment_type": "small",
        "allocated_size": 1024,
        "active_size": 1024,
        "requested_size": 1000,
        "blocks": [used, free],
    }
    events = [  # (action, address, size, frames)
        ("segment_alloc", base, 2 << 20, [frame]),
        ("alloc", base, 1024, [cpp, frame]),
        ("alloc", base + 1024, 512, [frame]),
        ("free_requested", base + 1024, 512, []),
        ("free_completed", base + 1024, 512, []),
    ]
    trace = []
    for time_us, (action, addr, size, frames) in enumerate(events, start=1):
        event = {
            "action": action,
            "addr": addr,
            "size": size,
            "stream": 0,
            "time_us": time_us,
            "frames": frames,
        }
        trace.append(event)
    return {"segments": [segment], "device_traces": [trace]}


def test_cached_block_use_follows_best_fit_and_the_split_rules():
    from trainfast.kernels.allocator import cached_block_use

    mib = 1 << 20
    assert cached_block_use(12 * mib, 15 * mib, pool="large") == 12 * mib  # split: 3 MiB stay free
    assert cached_block_use(14 * mib + mib // 2, 15 * mib, pool="large") == 15 * mib  # no split
    assert cached_block_use(16 * mib, 15 * mib, pool="large") is None  # too small
    assert cached_block_use(mib, 15 * mib, pool="large") is None  # a small-pool request
    assert cached_block_use(1000, 2 * mib, pool="small") == 1024  # split at 512 bytes or more
    assert cached_block_use(2 * mib - 100, 2 * mib, pool="large") == 2 * mib  # 512 B left: whole
    # max_split_size_mb: big blocks serve only big requests, within 20 MiB, whole
    kwargs = {"pool": "large", "max_split_size_bytes": 200 * mib}
    assert cached_block_use(5 * mib, 300 * mib, **kwargs) is None
    assert cached_block_use(250 * mib, 300 * mib, **kwargs) is None
    assert cached_block_use(290 * mib, 300 * mib, **kwargs) == 300 * mib
    with pytest.raises(ValueError, match="pool"):
        cached_block_use(1, 2, pool="medium")


def test_the_chapters_max_split_example_holds_for_a_setting_pytorch_accepts():
    """The chapter's example of ``max_split_size_mb``: a freed 60 MiB segment under
    ``max_split_size_mb:32``, a limit PyTorch accepts (20 MiB or more)."""
    from trainfast.kernels.allocator import cached_block_use, segment_bytes

    mib = 1 << 20
    block = segment_bytes(60 * mib)
    assert block == 60 * mib
    limited = {"pool": "large", "max_split_size_bytes": 32 * mib}
    assert cached_block_use(8 * mib, block, pool="large") == 8 * mib  # unlimited: split
    assert cached_block_use(8 * mib, block, **limited) is None  # too big a block for 8 MiB
    assert cached_block_use(40 * mib, block, **limited) is None  # 20 MiB or more to spare
    assert cached_block_use(48 * mib, block, **limited) == block  # whole, never split
    assert cached_block_use(48 * mib, block, pool="large") == 48 * mib


@pytest.mark.parametrize(
    ("setting", "value"), [("max_split_size_mb", 10), ("max_non_split_rounding_mb", 19)]
)
def test_cached_block_use_refuses_settings_pytorch_refuses(setting, value):
    """torch 2.14 refuses ``max_split_size_mb:10`` ("too small, must be >= 20", in
    ``parseMaxSplitSize``); so does the model, for both limits, and 20 MiB is accepted."""
    from trainfast.kernels.allocator import cached_block_use

    keyword = {"max_split_size_mb": "max_split_size_bytes"}.get(
        setting, "max_non_split_rounding_bytes"
    )
    with pytest.raises(ValueError, match=rf"Invalid {setting}: {value} MiB .*least 20 MiB"):
        cached_block_use(2 << 20, 15 << 20, pool="large", **{keyword: value << 20})
    assert cached_block_use(2 << 20, 15 << 20, pool="large", **{keyword: 20 << 20}) is not None


def test_pytorch_refuses_a_max_split_size_below_20_mib():
    """The rule the model copies, read from the installed PyTorch (parsed without a GPU)."""
    setter = getattr(torch._C, "_accelerator_setAllocatorSettings", None)
    if setter is None:
        pytest.skip(f"torch {torch.__version__} has no _accelerator_setAllocatorSettings")
    with pytest.raises(
        (ValueError, RuntimeError), match="max_split_size_mb too small, must be >= 20"
    ):
        setter("max_split_size_mb:10")  # refused before anything is set: nothing to restore


def test_trimmed_snapshot_is_small_json_and_memory_viz_reads_it():
    import json

    from trainfast.kernels.allocator import memory_timeline, segment_summary, trim_snapshot

    trimmed = trim_snapshot(_fake_snapshot())
    assert json.loads(json.dumps(trimmed)) == trimmed
    assert trimmed["segments"][0]["blocks"][0]["frames"] == [
        {"filename": "train.py", "line": 7, "name": "step"}
    ]
    summary = segment_summary(trimmed)
    assert "segments: 1" in summary and "total_reserved: 2.0MiB" in summary
    timeline = memory_timeline(trimmed)
    assert timeline["allocated"] == [0, 1024, 1536, 1024] and timeline["reserved"] == [2 << 20] * 4


def test_checkpointing_trades_memory_for_compute():
    from trainfast.kernels.checkpointing import checkpointing_costs
    from trainfast.transformer import TransformerShape

    shape = TransformerShape(
        vocab_size=64, d_model=32, n_layers=2, n_heads=2, d_ff=64, seq_len=16, batch_size=2
    )
    off, on = checkpointing_costs(shape, device=torch.device("cpu"), attention="manual", repeats=1)
    assert (off["checkpointing"], on["checkpointing"]) == (False, True)
    assert on["saved_bytes"] < off["saved_bytes"] / 2
    assert off["counted_flops"] == off["model_flops"] < on["counted_flops"]
    for r in (off, on):
        assert r["step_seconds_min"] <= r["step_seconds"] <= r["step_seconds_max"]
    assert off["predicted_bytes"] <= off["saved_bytes"] <= off["predicted_bytes"] * 1.1
    # like for like: after the forward, without the block the backward rebuilds (LayerNorm
    # statistics are the unmodelled rest)
    for r in (off, on):
        assert r["predicted_saved_bytes"] <= r["saved_bytes"] <= r["predicted_saved_bytes"] * 1.1
    assert on["predicted_saved_bytes"] < on["predicted_bytes"]


def test_the_gpu_checkpointing_record_meets_its_saved_prediction():
    """The H100 record predates the ``predicted_saved_bytes`` column: it is computed from the
    benchmark's model (whose formula must be the record's ``predicted_bytes``) and lies within
    1% of the bytes saved after the forward, with checkpointing on and off."""
    from dataclasses import replace

    from trainfast.kernels.checkpointing import with_saved_prediction
    from trainfast.records import records_for

    for record in records_for("activation-checkpointing", "cuda"):
        completed = with_saved_prediction(record)
        assert completed.columns.index("predicted_saved_bytes") > completed.columns.index(
            "saved_bytes"
        )
        for row in completed.rows:
            assert row["saved_bytes"] == pytest.approx(row["predicted_saved_bytes"], rel=0.01)
        wrong = [{**row, "predicted_bytes": row["predicted_bytes"] + 1} for row in record.rows]
        with pytest.raises(ValueError, match="not the formula"):
            with_saved_prediction(replace(record, rows=wrong))


def test_target_ratios_name_the_ratio_and_the_verdict():
    from trainfast.kernels.benchmarks import target_ratios
    from trainfast.records import make_record

    rows = [
        {
            "implementation": "torch copy_",
            "bytes": 1 << 30,
            "gb_per_s": 3000.0,
            "ratio_to_torch": 1.0,
        },
        {
            "implementation": "triton copy_kernel",
            "bytes": 1 << 30,
            "gb_per_s": 2820.0,
            "ratio_to_torch": 0.94,
        },
        {
            "implementation": "triton copy_kernel",
            "bytes": 1 << 20,
            "gb_per_s": 10.0,
            "ratio_to_torch": 0.1,
        },
    ]
    record = make_record("copy-bandwidth", "test", rows)
    record.environment.update(device="cuda", device_name="Some GPU")
    (line,) = target_ratios([record])
    assert line.endswith("0.94 on Some GPU (cuda); target >= 0.90: met")
    rows[1]["ratio_to_torch"] = 0.5
    assert target_ratios([record])[0].endswith("target >= 0.90: NOT met")
    record.environment["device"] = "cpu"
    assert "not measured on Some GPU (cpu)" in target_ratios([record])[0]


# --- the exercises: each check passes the right answer and catches a wrong one ----------------


def test_exercise_checks_pass_right_answers_and_catch_wrong_ones(capsys):
    import math

    from trainfast.kernels.exercises import (
        check_causal_key_tiles,
        check_matmul_intensity,
        check_segment_bytes,
        check_softmax_merge,
    )

    check_matmul_intensity(lambda m, k, n, e: 2 * m * k * n / ((m * k + k * n + m * n) * e))
    with pytest.raises(
        AssertionError, match=r"cases failed; first: \(4096, 4096\) @ \(4096, 4096\)"
    ):
        check_matmul_intensity(lambda m, k, n, e: 2 * m * k * n / ((m * k + k * n) * e))  # forgot C

    check_softmax_merge(merge_softmax_stats)

    def naive(max_a, sum_a, max_b, sum_b):  # no guard for an empty part: -inf - -inf is NaN
        new_max = torch.maximum(max_a, max_b)
        return new_max, sum_a * torch.exp(max_a - new_max) + sum_b * torch.exp(max_b - new_max)

    naive(*softmax_stats(torch.randn(2, 4)), *softmax_stats(torch.randn(2, 4)))  # ordinary: fine
    with pytest.raises(AssertionError, match=r"1 of 5 cases failed; first: both parts empty"):
        check_softmax_merge(naive)

    def naive_or_nan(max_a, sum_a, max_b, sum_b):  # NaN sums when the first part is empty
        if torch.isinf(max_a).all():
            return max_b, sum_b * float("nan")
        return naive(max_a, sum_a, max_b, sum_b)

    with pytest.raises(AssertionError, match="first part empty"):
        check_softmax_merge(naive_or_nan)

    def unshifted(max_a, sum_a, max_b, sum_b):  # right in exact arithmetic, but exp(1000) overflows
        new_max = torch.maximum(max_a, max_b)
        return new_max, (sum_a * torch.exp(max_a) + sum_b * torch.exp(max_b)) * torch.exp(-new_max)

    with pytest.raises(AssertionError, match=r"cases failed; first: maxima 1000 apart"):
        check_softmax_merge(unshifted)

    check_causal_key_tiles(lambda q, bq, n, bk: list(range(0, min(n, q + bq), bk)))
    with pytest.raises(AssertionError, match="cases failed"):
        check_causal_key_tiles(
            lambda q, bq, n, bk: list(range(0, min(n, q), bk))
        )  # misses the diagonal tile
    with pytest.raises(
        AssertionError,
        match=r"3 of 9 cases failed; first: queries 0..127, 4096 "
        r"keys in tiles of 64: \[0, 64\]: got \[0\]",
    ):
        check_causal_key_tiles(  # the first query's keys only: drops tiles when block_k < block_q
            lambda q, bq, n, bk: list(range(0, min(n, q + 1), bk))
        )
    with pytest.raises(
        AssertionError,
        match=r"1 of 9 cases failed; first: queries 3..6, 100 keys "
        r"in tiles of 1",
    ):
        check_causal_key_tiles(  # one query short of the tile's last
            lambda q, bq, n, bk: list(range(0, min(n, q + bq - 1), bk))
        )

    def reserve(nbytes):
        size = 512 * math.ceil(nbytes / 512)
        if size <= 1 << 20:
            return 2 << 20
        return 20 << 20 if size < 10 << 20 else (2 << 20) * math.ceil(size / (2 << 20))

    check_segment_bytes(reserve)

    def reserve_unrounded(nbytes):  # skips the rounding to 512 bytes
        if nbytes <= 1 << 20:
            return 2 << 20
        return 20 << 20 if nbytes < 10 << 20 else (2 << 20) * math.ceil(nbytes / (2 << 20))

    with pytest.raises(AssertionError, match=r"1 of 9 cases failed; first: 10,485,660 bytes"):
        check_segment_bytes(reserve_unrounded)
    with pytest.raises(AssertionError, match="cases failed"):
        check_segment_bytes(
            lambda nbytes: 512 * math.ceil(nbytes / 512)
        )  # the block, not the segment
    assert "FAILED" in capsys.readouterr().out


def test_triton_exercise_check_passes_a_kernel_and_catches_a_missing_mask():
    from axpb_kernel import launcher  # a module as a reader's notebook has it (Triton 3.0)
    from trainfast.kernels.exercises import check_triton_axpb

    check_triton_axpb(launcher(True))
    with pytest.raises(
        AssertionError, match=r"first: 1 elements of torch.float32: wrote 255 values past the end"
    ):
        check_triton_axpb(launcher(False))
    with pytest.raises(AssertionError, match=r"4 of 4 cases failed.*raised"):
        check_triton_axpb(lambda x, a, b, out: out.copy_(a * x + b).nonexistent)


@pytest.mark.skipif(CUDA, reason="the loads are watched in Triton's CPU interpreter")
def test_triton_exercise_check_catches_a_load_without_a_mask(capsys):
    """The half-fixed answer: the store is masked, the load is not. Its output is right and it
    writes nothing past ``out``; only the addresses it loads show the bug (255 past the end of a
    one-element ``x`` with blocks of 256)."""
    from axpb_kernel import launcher
    from trainfast.kernels.exercises import check_triton_axpb

    with pytest.raises(
        AssertionError,
        match=r"4 of 4 cases failed; first: 1 elements of torch.float32: read 255 values past "
        r"the end of x \(a load without a mask\?\)",
    ):
        check_triton_axpb(launcher(True, mask_load=False))
    check_triton_axpb(launcher(True))  # the loads are watched, and the watch is removed after
    assert "not watched" not in capsys.readouterr().out


# --- the chapter -----------------------------------------------------------------------------


def test_listings_resolve_to_package_code():
    import chapters

    assert chapters.listing_problems("memory_hierarchy") == []


#: Constants the memory-hierarchy chapter may type: the illustrative step times of its opening
#: (100 and 300 ms); Kaplan et al.'s 2 + 4 = 6 FLOPs per weight per token and the float32 add's
#: 1 FLOP per 12 bytes; the settings its cells are keyed by (GPT-2's context of 1,024, the
#: benchmark's 4096 tokens, tile sizes 16, 64, 128 and 256, stride 1); NVIDIA's hardware
#: constants (32 threads per warp, 32-byte sectors, 128-byte lines, 4-byte float32); base-2
#: exponentials; the caching allocator's 512-byte rounding (kMinBlockSize); and the PyTorch
#: version that added ``wrap_triton`` (2.6).


# --- on a GPU: the allocator and the benchmarks ------------------------------------------------


@pytest.mark.gpu
@gpu
def test_gpu_allocator_rounding_matches_the_rules():
    from trainfast.kernels.allocator import allocator_rounding_record

    record = allocator_rounding_record(torch.device("cuda"), quick=True)
    for row in record.rows:
        assert row["allocated_bytes"] == row["predicted_block_bytes"], row
        assert row["reserved_bytes"] == row["predicted_segment_bytes"], row


@pytest.mark.gpu
@gpu
def test_gpu_snapshot_and_benchmarks_run_quick():
    import json

    from trainfast.kernels import benchmarks
    from trainfast.kernels.allocator import (
        allocator_snapshot_record,
        memory_timeline,
        segment_summary,
    )

    record = allocator_snapshot_record(torch.device("cuda"), quick=True)
    assert [row["expandable_segments"] for row in record.rows] == [False, True]
    snapshot = record.rows[0]["snapshot"]
    assert json.loads(json.dumps(snapshot)) == snapshot and "segments:" in segment_summary(snapshot)
    assert max(memory_timeline(snapshot)["allocated"]) > 0
    runs = [
        benchmarks.copy_record,
        benchmarks.matmul_record,
        benchmarks.attention_record,
        benchmarks.roofline_record,
        benchmarks.strided_record,
        benchmarks.host_transfer_record,
    ]
    for run in runs:
        assert run(torch.device("cuda"), True).rows


@pytest.mark.parametrize("name", ["tile_queries", "tile_keys"])
@pytest.mark.parametrize("value", [0, -64, 1.5, True, "64"])
def test_flash_attention_rejects_bad_tile_sizes(monkeypatch, name, value):
    """A tile size that is not a positive int is named, never turned into garbage or NaN."""
    monkeypatch.setattr(FlashAttention, name, value)
    q, k, v = (torch.randn(1, 2, 8, 4) for _ in range(3))
    with pytest.raises(ValueError, match=rf"Invalid {name}: {re.escape(repr(value))}"):
        flash_attention(q, k, v, is_causal=True)


@pytest.mark.parametrize(
    ("field", "value"), [("block_size", 0), ("num_warps", 0), ("block_size", -8)]
)
def test_copy_tensor_rejects_zero_launch_settings(field, value):
    from trainfast.kernels import copy_tensor

    with pytest.raises(ValueError, match=rf"Invalid {field}: {value}"):
        copy_tensor(torch.randn(10), **{field: value})


def test_strided_traffic_counts_index_and_output():
    """16 bytes per element at stride 1 (source 4, index 4, output written 4 after a
    write-allocate read 4); 76 from one read per 64-byte line on: 4.75 times, not 16."""
    from trainfast.kernels.bandwidth import strided_traffic_bytes

    traffic = {s: strided_traffic_bytes(1, s, unit_bytes=64) for s in (1, 2, 16, 64)}
    assert traffic == {1: 16, 2: 20, 16: 76, 64: 76}
    assert strided_traffic_bytes(1, 8, unit_bytes=32) == 4 * 8 + 4 + 8  # 32-byte units
    # a GPU's L2 writes whole sectors without reading them first: the output costs one write
    assert strided_traffic_bytes(1, 8, unit_bytes=32, write_allocate=False) == 4 * 8 + 4 + 4


def test_strided_buffer_stays_above_the_last_cache_at_every_stride():
    from trainfast.kernels.bandwidth import strided_buffer_elements

    cache, line = 32 << 20, 64
    for largest in (16, 32, 64):
        n = strided_buffer_elements(largest, cache, unit_bytes=line)
        assert n & (n - 1) == 0 and n * 4 >= 2 * cache
        pass_bytes = line * n // max(largest, line // 4)  # the lines one pass touches
        assert pass_bytes >= 2 * cache


def test_shuffled_order_keeps_passes_pages_and_lines():
    """The control reads what stride order reads, pass by pass and page by page, in another
    order; at stride 1 whole lines stay together."""
    from trainfast.kernels.bandwidth import shuffled_order, strided_order

    n, unit, page = 1 << 12, 16, 1024
    for stride in (1, 4, 16, 32):
        ordered = strided_order(n, stride).long()
        shuffled = shuffled_order(n, stride, unit_elements=unit, page_elements=page).long()
        assert not torch.equal(shuffled, ordered)
        per_pass = n // stride
        for passes in (ordered, shuffled):
            assert passes.view(stride, per_pass).shape == (stride, per_pass)
        assert torch.equal(
            shuffled.view(stride, per_pass).sort(dim=1).values,
            ordered.view(stride, per_pass).sort(dim=1).values,
        )
        # page by page: the pages of consecutive reads appear in the same order
        assert torch.equal(
            (shuffled // page).unique_consecutive(), (ordered // page).unique_consecutive()
        )
    lines = shuffled_order(n, 1, unit_elements=unit, page_elements=page).view(-1, unit)
    assert torch.equal(lines - lines[:, :1], torch.arange(unit).expand_as(lines))


# --- the chunked cross-entropy over the LM head ------------------------------------------------


def _head(tokens, vocab, width, dtype, seed=0):
    generator = torch.Generator().manual_seed(seed)
    hidden = torch.randn(tokens, width, generator=generator).to(dtype).requires_grad_()
    weight = (torch.randn(vocab, width, generator=generator) / width**0.5).to(dtype)
    targets = torch.randint(0, vocab, (tokens,), generator=generator)
    return hidden, weight.requires_grad_(), targets


@pytest.mark.parametrize("chunk_size", [1, 7, 64, 1000])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_chunked_cross_entropy_matches_f_cross_entropy_in_value_and_gradient(chunk_size, dtype):
    """Against ``F.cross_entropy`` of the whole logits, with chunks that do not divide the 100
    tokens, one chunk larger than all of them, and ignored targets (``ignore_index``)."""
    from trainfast.kernels.chunked_cross_entropy import chunked_cross_entropy

    hidden, weight, targets = _head(100, 300, 24, dtype)
    targets[::9] = -100  # ignored, as F.cross_entropy ignores them: not in the mean
    loss = chunked_cross_entropy(hidden, weight, targets, chunk_size)
    expected = F.cross_entropy((hidden @ weight.T).float(), targets, ignore_index=-100)
    tolerance = TOLERANCE[torch.float32]  # the logits are float32 in both
    torch.testing.assert_close(loss.double(), expected.double(), **tolerance)
    grads = torch.autograd.grad(loss * 3.0, (hidden, weight))  # an upstream gradient of 3
    expected_grads = torch.autograd.grad(expected * 3.0, (hidden, weight))
    for name, grad, reference in zip(("hidden", "weight"), grads, expected_grads, strict=True):
        assert grad.dtype == dtype, name
        torch.testing.assert_close(grad.double(), reference.double(), **tolerance, msg=name)


def test_chunked_cross_entropy_in_bfloat16_matches_the_float32_logits_path():
    from trainfast.kernels.chunked_cross_entropy import (
        chunked_cross_entropy,
        cross_entropy_reference,
    )

    hidden, weight, targets = _head(64, 500, 32, torch.bfloat16)
    loss = chunked_cross_entropy(hidden, weight, targets, 16)
    expected = cross_entropy_reference(hidden, weight, targets)
    torch.testing.assert_close(loss, expected, atol=1e-5, rtol=1e-5)
    grads = torch.autograd.grad(loss, (hidden, weight))
    expected_grads = torch.autograd.grad(expected, (hidden, weight))
    for grad, reference in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(grad.float(), reference.float(), **TOLERANCE[torch.bfloat16])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("chunk_size", [128, 512])
def test_chunked_cross_entropy_memory_is_its_model_and_far_below_the_whole_logits(
    dtype, chunk_size
):
    """The allocator's peak (CPU, profiler memory events) of forward + backward: the chunked
    path within 2% of :func:`chunked_loss_buffer_bytes` in float32 (15% in bfloat16), the
    whole-logits path its 12
    bytes a logit (log-probabilities and two float32 gradients; the step that keeps its
    logits alive holds 16, ``loss_buffer_bytes``)."""
    from trainfast.counters import peak_allocated_bytes
    from trainfast.kernels.chunked_cross_entropy import (
        chunked_cross_entropy,
        chunked_loss_buffer_bytes,
        cross_entropy_reference,
    )

    torch.set_num_threads(1)
    tokens, vocab, width = 2048, 4096, 64
    hidden, weight, targets = _head(tokens, vocab, width, dtype)
    chunked = peak_allocated_bytes(
        lambda: chunked_cross_entropy(hidden, weight, targets, chunk_size).backward()
    )
    whole = peak_allocated_bytes(
        lambda: cross_entropy_reference(hidden, weight, targets).backward()
    )
    predicted = chunked_loss_buffer_bytes(
        tokens, vocab, width, chunk_size, value_bytes=hidden.element_size()
    )
    # bfloat16 on this CPU: its 16-bit products copy an operand, a workspace the model leaves out
    slack = 1.02 if dtype == torch.float32 else 1.15
    assert predicted <= chunked <= slack * predicted, (chunked, predicted)
    assert 12 * tokens * vocab <= whole <= 12 * tokens * vocab + 512  # and the loss itself
    assert whole > 3 * chunked


def test_chunked_cross_entropy_names_bad_input():
    from trainfast.kernels.chunked_cross_entropy import chunked_cross_entropy

    hidden, weight, targets = _head(10, 30, 8, torch.float32)
    with pytest.raises(ValueError, match="chunk_size"):
        chunked_cross_entropy(hidden, weight, targets, 0)
    with pytest.raises(ValueError, match=r"one width, got \(10, 8\) and \(30, 9\)"):
        chunked_cross_entropy(hidden, torch.randn(30, 9), targets)
    with pytest.raises(ValueError, match=r"targets must be int64 of shape \(10,\)"):
        chunked_cross_entropy(hidden, weight, targets[:5])
    with pytest.raises(ValueError, match="share a dtype and a device"):
        chunked_cross_entropy(hidden, weight.double(), targets)


# --- the matmul's launch order and its wave model ----------------------------------------------


def test_program_tile_is_the_kernels_grouped_order():
    """Each program gets one tile of C, every tile is computed once; group 1 is row by row, and
    group 8 goes down 8 rows of tiles before moving right (the kernel's first lines)."""
    from trainfast.kernels.tiled_matmul import MatmulTiles, program_tile

    for group in (1, 3, 8):
        tiles = MatmulTiles(32, 64, 32, group_m=group)
        grid = [program_tile(pid, 300, 500, tiles) for pid in range(10 * 8)]  # 10 × 8 tiles
        assert sorted(grid) == [(r, c) for r in range(10) for c in range(8)]
    row_major = MatmulTiles(32, 64, 32, group_m=1)
    assert [program_tile(pid, 300, 500, row_major) for pid in range(9)] == [
        *((0, c) for c in range(8)),
        (1, 0),
    ]
    grouped = MatmulTiles(32, 64, 32, group_m=8)
    assert [program_tile(pid, 300, 500, grouped) for pid in (0, 1, 7, 8, 63, 64, 65)] == [
        (0, 0),
        (1, 0),
        (7, 0),
        (0, 1),
        (7, 7),
        (8, 0),
        (9, 0),  # the last group has 2 rows
    ]
    with pytest.raises(ValueError, match="Invalid pid: 80"):
        program_tile(80, 300, 500, grouped)


def test_matmul_kernel_computes_every_tile_in_either_launch_order():
    """The interpreted kernel with group 1 and group 3 (ragged: 5 rows of tiles) gives the same
    product: the launch order changes which program computes a tile, not the result."""
    from trainfast.kernels.tiled_matmul import MatmulTiles, matmul

    a, b = torch.randn(150, 40), torch.randn(40, 70)
    for group in (1, 3):
        tiles = MatmulTiles(32, 32, 32, group_m=group, num_warps=4, num_stages=1)
        torch.testing.assert_close(matmul(a, b, tiles=tiles), a @ b, atol=1e-4, rtol=1e-4)


def test_wave_traffic_counts_the_strips_each_wave_touches():
    """Brute force on a small grid, the bounds (A and B once ≤ waves ≤ no cache), and the
    launch order's effect: a wave narrower than a row of tiles reads a new B strip per program
    row by row, and far fewer grouped."""
    from trainfast.kernels.tiled_matmul import (
        MatmulTiles,
        program_tile,
        tile_traffic_bytes,
        wave_traffic_bytes,
    )

    tiles = MatmulTiles(16, 32, 16, group_m=2)
    m, n, k = 64, 128, 48  # 4 × 4 tiles
    expected = 0
    for start in range(0, 16, 5):  # waves of 5 programs
        wave = [program_tile(p, m, n, tiles) for p in range(start, min(16, start + 5))]
        expected += len({r for r, _ in wave}) * 16 + len({c for _, c in wave}) * 32
    assert wave_traffic_bytes(m, n, k, tiles, 5, 2) == (expected * k + m * n) * 2
    assert wave_traffic_bytes(m, n, k, tiles, 1, 2) == tile_traffic_bytes(m, n, k, tiles, 2)
    assert wave_traffic_bytes(m, n, k, tiles, 16, 2) == (m * k + k * n + m * n) * 2
    size, row_major, grouped = 32768, MatmulTiles(128, 256, 64, 1), MatmulTiles(128, 256, 64, 8)
    assert wave_traffic_bytes(size, size, size, row_major, 132, 2) > 5 * wave_traffic_bytes(
        size, size, size, grouped, 132, 2
    )


def _counted_quantisation(m, n, k, tiles, programs_in_flight):
    """Tile and wave quantisation counted by brute force: every tile of C and every K step
    (useful multiply-adds: the part inside the matrices; issued: the whole tile), and the
    programs placed one by one in slots, a new wave when the slots run out."""
    useful = issued = programs = 0
    for row in range(0, m, tiles.block_m):
        for col in range(0, n, tiles.block_n):
            programs += 1
            for depth in range(0, k, tiles.block_k):
                inside = min(tiles.block_m, m - row) * min(tiles.block_n, n - col)
                useful += inside * min(tiles.block_k, k - depth)
                issued += tiles.block_m * tiles.block_n * tiles.block_k
    waves = free = 0
    for _ in range(programs):
        if free == 0:
            waves, free = waves + 1, programs_in_flight
        free -= 1
    return programs, waves, useful / issued, programs / (waves * programs_in_flight)


@pytest.mark.parametrize("in_flight", [1, 5, 132])
def test_dimension_quantisation_matches_a_count_of_tiles_and_the_launch_grid(in_flight):
    """The model against a tile-by-tile count, on sizes at, below and just past a multiple of
    each block, and its programs against the grid :func:`matmul_launch` gives the kernel."""
    from trainfast.kernels.tiled_matmul import MatmulTiles, dimension_quantisation, matmul_launch

    for tiles in (MatmulTiles(16, 32, 16), MatmulTiles(64, 16, 32)):
        for m in (1, 15, 16, 17, 100):
            for n in (31, 32, 33, 257):
                for k in (1, 16, 17, 90):
                    model = dimension_quantisation(m, n, k, tiles, in_flight)
                    programs, waves, tile_eff, wave_eff = _counted_quantisation(
                        m, n, k, tiles, in_flight
                    )
                    case = (tiles.block_m, tiles.block_n, tiles.block_k, m, n, k, in_flight)
                    assert (model.programs, model.waves) == (programs, waves), case
                    assert model.tile_efficiency == pytest.approx(tile_eff, rel=1e-12), case
                    assert model.wave_efficiency == pytest.approx(wave_eff, rel=1e-12), case
                    a, b = torch.empty(m, k, device="meta"), torch.empty(k, n, device="meta")
                    grid, _, _ = matmul_launch(a, b, torch.empty(m, n, device="meta"), tiles)
                    assert grid == (model.programs,), case
    h100_tile = MatmulTiles(128, 256, 64)  # the default bf16 tiles on an H100 or H200
    counted = _counted_quantisation(4160, 4160, 4160, h100_tile, in_flight)
    model = dimension_quantisation(4160, 4160, 4160, h100_tile, in_flight)
    assert (model.programs, model.waves) == counted[:2]
    assert (model.tile_efficiency, model.wave_efficiency) == pytest.approx(counted[2:])


def test_quantisation_prediction_is_a_sawtooth_past_4096_and_refuses_bad_input():
    """At the default bf16 tiles, 132 programs at a time: 4096³ is 512 programs in 4 waves
    (97 % of the slots); each of the benchmark's sizes takes a fifth wave, and the partial tiles
    of 4160³ and 4224³ cost more again."""
    from trainfast.gpus import GPUS
    from trainfast.kernels.matmul_benchmarks import QUANTISATION_SIZES, quantisation_prediction
    from trainfast.kernels.tiled_matmul import MatmulTiles, dimension_quantisation

    h100, tiles = GPUS["H100 SXM 80GB"], MatmulTiles(128, 256, 64)
    aligned = quantisation_prediction(h100, 4096, tiles)
    assert aligned.value == pytest.approx(989.4 * 512 / 528, rel=1e-3)
    rates = [quantisation_prediction(h100, size, tiles).value for size in QUANTISATION_SIZES]
    assert rates == sorted(rates) and rates[-1] < aligned.value, rates
    assert rates[0] == pytest.approx(989.4 * (4160 / 4224) * (4160 / 4352) * 561 / 660, rel=1e-3)
    with pytest.raises(ValueError, match="programs_in_flight"):
        dimension_quantisation(64, 64, 64, tiles, 0)
    with pytest.raises(ValueError, match="Invalid m: 0"):
        dimension_quantisation(0, 64, 64, tiles, 132)


def test_launch_order_shows_first_at_32768_on_an_h100_and_not_on_an_h200():
    """The wave model at the 4096³ rate the H100 record measured for these tiles (about 470
    TFLOP/s, an input here): the two orders tie up to 16384³; at 32768³ the row-by-row order's
    bytes bind on an H100 (3.35 TB/s) and not on an H200 (4.8 TB/s)."""
    from trainfast.gpus import GPUS
    from trainfast.kernels.matmul_benchmarks import launch_order_prediction
    from trainfast.kernels.tiled_matmul import MatmulTiles

    rate = 470e12
    for name, slower_at_32768 in (("H100 SXM 80GB", True), ("H200 SXM 141GB", False)):
        gpu = GPUS[name]
        for size in (4096, 8192, 16384, 32768):
            rates = [
                launch_order_prediction(gpu, size, MatmulTiles(128, 256, 64, group), rate).value
                for group in (1, 8)
            ]
            assert rates[1] == pytest.approx(rate / 1e12)
            slower = rates[0] < 0.99 * rates[1]
            assert slower == (slower_at_32768 and size == 32768), (name, size, rates)
    at_peak = launch_order_prediction(
        GPUS["H100 SXM 80GB"], 16384, MatmulTiles(128, 256, 64, 1), 989.4e12
    )
    assert at_peak.value < 0.9 * 989.4  # near the peak, 16384³ would show it already


def test_a_one_stage_launch_is_described_without_a_plural_seam():
    """The compile report's tile text reads "1 stage", not "1 stages" (the T4's and the copy's
    launches have one stage), and keeps the plural otherwise."""
    from trainfast.kernels.compile_report import _describe
    from trainfast.kernels.elementwise import CopyTiles

    one = CopyTiles(block_size=1024, num_warps=4, num_stages=1)
    three = CopyTiles(block_size=1024, num_warps=4, num_stages=3)
    assert _describe(one) == "1024, 4 warps, 1 stage"
    assert _describe(three) == "1024, 4 warps, 3 stages"
