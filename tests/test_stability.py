"""trainfast.stability against torch: gradient clipping, z-loss, soft-capping, QK-norm attention."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from trainfast.stability import QKNormAttention, clip_grad_norm_, softcap, z_loss


def _twin_grads(scale: float = 1.0, seed: int = 0) -> tuple[list[nn.Parameter], list[nn.Parameter]]:
    torch.manual_seed(seed)
    shapes = [(4, 3), (3,), (2, 2, 2)]
    ours = [nn.Parameter(torch.randn(s)) for s in shapes]
    theirs = [nn.Parameter(p.detach().clone()) for p in ours]
    for p, q in zip(ours, theirs, strict=True):
        p.grad = torch.randn(p.shape) * scale
        q.grad = p.grad.clone()
    ours.append(nn.Parameter(torch.randn(2)))  # no gradient: skipped by both
    theirs.append(nn.Parameter(torch.randn(2)))
    return ours, theirs


@pytest.mark.parametrize("foreach", [False, True])
@pytest.mark.parametrize("norm_type", [2.0, 1.0, 3.0, math.inf])
@pytest.mark.parametrize("max_norm", [0.5, 1e3])
def test_clip_grad_norm_matches_torch(foreach: bool, norm_type: float, max_norm: float) -> None:
    ours, theirs = _twin_grads()
    norm = clip_grad_norm_(ours, max_norm, norm_type, foreach=foreach)
    expected = torch.nn.utils.clip_grad_norm_(theirs, max_norm, norm_type, foreach=foreach)
    torch.testing.assert_close(norm, expected)
    for p, q in zip(ours, theirs, strict=True):
        assert (p.grad is None) == (q.grad is None)
        if p.grad is not None:
            torch.testing.assert_close(p.grad, q.grad)
    total = torch.linalg.vector_norm(
        torch.cat([p.grad.flatten() for p in ours if p.grad is not None]), norm_type
    )
    assert total.item() <= max_norm * (1 + 1e-5) or max_norm > norm.item()


def test_clip_grad_norm_single_tensor_and_no_grads() -> None:
    weight = nn.Parameter(torch.zeros(3))
    assert clip_grad_norm_([weight], 1.0).item() == 0.0  # nothing to clip
    weight.grad = torch.tensor([3.0, 4.0, 0.0])
    assert clip_grad_norm_(weight, 1.0).item() == pytest.approx(5.0)
    assert weight.grad.norm().item() == pytest.approx(1.0, rel=1e-5)


@pytest.mark.parametrize("foreach", [False, True])
@pytest.mark.parametrize("bad", [math.inf, math.nan])
def test_clip_grad_norm_non_finite_like_torch(foreach: bool, bad: float) -> None:
    ours, theirs = _twin_grads()
    for group in (ours, theirs):
        group[0].grad[0, 0] = bad
    with pytest.raises(RuntimeError, match="non-finite"):
        clip_grad_norm_(ours, 1.0, error_if_nonfinite=True, foreach=foreach)
    with pytest.raises(RuntimeError, match="non-finite"):
        torch.nn.utils.clip_grad_norm_(theirs, 1.0, error_if_nonfinite=True, foreach=foreach)
    norm = clip_grad_norm_(ours, 1.0, foreach=foreach)  # scales by the non-finite factor, as torch
    expected = torch.nn.utils.clip_grad_norm_(theirs, 1.0, foreach=foreach)
    torch.testing.assert_close(norm, expected, equal_nan=True)
    for p, q in zip(ours[:3], theirs[:3], strict=True):
        torch.testing.assert_close(p.grad, q.grad, equal_nan=True)


def test_clip_grad_norm_bad_input() -> None:
    ours, _ = _twin_grads()
    with pytest.raises(ValueError, match="max_norm: -1"):
        clip_grad_norm_(ours, -1.0)
    with pytest.raises(ValueError, match="norm_type: 0"):
        clip_grad_norm_(ours, 1.0, norm_type=0)


def test_z_loss_is_weighted_squared_logsumexp_and_pulls_log_z_to_zero() -> None:
    torch.manual_seed(0)
    logits = (torch.randn(8, 10) + 5.0).requires_grad_(True)
    expected = 1e-4 * (torch.log(torch.exp(logits).sum(-1)) ** 2).mean()
    torch.testing.assert_close(z_loss(logits), expected)
    z_loss(logits, weight=1.0).backward()
    # the gradient raises or lowers every logit of a row together: softmax(logits) * 2 log Z / n
    log_z = torch.logsumexp(logits, -1, keepdim=True)
    torch.testing.assert_close(logits.grad, 2 * log_z.detach() * logits.softmax(-1).detach() / 8)
    assert (logits.grad > 0).all()  # log Z > 0 here: descending lowers it
    with pytest.raises(ValueError, match="weight: -1"):
        z_loss(logits, weight=-1)


def test_softcap_bounds_and_is_near_identity_for_small_logits() -> None:
    x = torch.linspace(-1000, 1000, 101)
    capped = softcap(x, 30.0)
    assert capped.abs().max() <= 30.0  # tanh rounds to exactly 1 in float32 far out
    small = torch.tensor([0.01, -0.5, 1.0])
    torch.testing.assert_close(softcap(small, 50.0), small, rtol=1e-3, atol=1e-4)
    assert torch.equal(torch.sign(capped), torch.sign(x))
    with pytest.raises(ValueError, match="cap: 0"):
        softcap(x, 0)


def test_attention_without_qk_norm_equals_sdpa() -> None:
    torch.manual_seed(0)
    attention = QKNormAttention(16, 4, qk_norm=False)
    x = torch.randn(2, 5, 16)  # (batch, seq, d_model)
    q, k, v = attention.qkv(x).view(2, 5, 3, 4, 4).permute(2, 0, 3, 1, 4)
    expected = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    expected = attention.out(expected.transpose(1, 2).reshape(2, 5, 16))
    torch.testing.assert_close(attention(x), expected, rtol=1e-5, atol=1e-6)


def test_qk_norm_bounds_logits_when_weights_grow() -> None:
    torch.manual_seed(0)
    x = torch.randn(2, 6, 16)
    plain, normed = QKNormAttention(16, 2, qk_norm=False), QKNormAttention(16, 2, qk_norm=True)
    normed.qkv.load_state_dict(plain.qkv.state_dict())
    with torch.no_grad():
        plain.qkv.weight.mul_(100.0)
        normed.qkv.weight.mul_(100.0)
    head_dim = 8
    # with unit gains, |q·k| / sqrt(d) <= |q||k| / sqrt(d) = sqrt(d) after LayerNorm
    assert normed.scores(x).abs().max().item() <= math.sqrt(head_dim) + 1e-4
    assert plain.scores(x).abs().max().item() > 100 * math.sqrt(head_dim)
    capped = QKNormAttention(16, 2, qk_norm=False, logit_cap=5.0)
    capped.qkv.load_state_dict(plain.qkv.state_dict())
    assert capped.scores(x).abs().max().item() <= 5.0
    with pytest.raises(ValueError, match="n_heads: 3"):
        QKNormAttention(16, 3)
