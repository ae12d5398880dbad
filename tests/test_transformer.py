"""The book's decoder, piece by piece against its references, and its costs counted exactly.

Each modern choice of :class:`trainfast.transformer.TransformerShape` is tested against the
thing it claims to be: RMSNorm against ``torch.nn.RMSNorm``, RoPE against the rotation written
with complex numbers (and its relative-position property), SwiGLU and ReLU² against their
formulas, grouped-query attention against SDPA's ``enable_gqa``. Then the accounting of
:mod:`trainfast.accounting` is checked against the model for every combination of choices:
parameters against ``numel()``, FLOPs against ``FlopCounterMode``, activation bytes against
what autograd saves. The presets' parameter counts are those their papers publish.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
from trainfast.accounting import (
    counted_flops,
    model_activation_bytes,
    parameter_count,
    saved_tensor_bytes,
    training_flops,
)
from trainfast.transformer import (
    MLP_KINDS,
    NORMS,
    POSITIONS,
    PRESET_SHAPES,
    CausalSelfAttention,
    RMSNorm,
    Transformer,
    TransformerMLP,
    TransformerShape,
    apply_rope,
    random_batch,
    rope_angles,
)

TINY = PRESET_SHAPES["tiny"]
MODERN = PRESET_SHAPES["tiny-modern"]


@pytest.fixture(autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _variants() -> list[TransformerShape]:
    """Every norm, position, MLP and head-sharing choice, with QK-norm, bias and tying varied
    along the way (a full product of all eight would be 288 models)."""
    shapes = []
    for i, (norm, positions, mlp, kv_heads) in enumerate(
        itertools.product(NORMS, POSITIONS, MLP_KINDS, (None, 2, 1))
    ):
        shapes.append(
            replace(
                TINY,
                norm=norm,
                positions=positions,
                mlp=mlp,
                n_kv_heads=kv_heads,
                qk_norm=i % 2 == 0,
                bias=i % 3 != 0,
                tied_head=i % 4 < 2,
            )
        )
    return shapes


VARIANTS = _variants()


# --------------------------------------------------------------------------- the pieces


def test_rmsnorm_matches_torch():
    torch.manual_seed(0)
    x = torch.randn(3, 5, 16, dtype=torch.float64)
    ours, theirs = RMSNorm(16, eps=1e-5).double(), torch.nn.RMSNorm(16, eps=1e-5).double()
    with torch.no_grad():
        ours.weight.normal_()
        theirs.weight.copy_(ours.weight)
    torch.testing.assert_close(ours(x), theirs(x), rtol=1e-12, atol=1e-12)
    x.requires_grad_(True)
    (grad_ours,) = torch.autograd.grad(ours(x).square().sum(), x)
    (grad_theirs,) = torch.autograd.grad(theirs(x).square().sum(), x)
    torch.testing.assert_close(grad_ours, grad_theirs, rtol=1e-10, atol=1e-12)


def test_rope_is_the_complex_rotation_of_adjacent_pairs():
    torch.manual_seed(0)
    seq, head_dim, theta = 7, 8, 500.0
    x = torch.randn(2, seq, 3, head_dim, dtype=torch.float64)  # (batch, seq, heads, head_dim)
    cos, sin = rope_angles(seq, head_dim, theta, dtype=torch.float64)
    ours = apply_rope(x, cos.unsqueeze(1), sin.unsqueeze(1))
    # RoFormer / Meta Llama: pairs (x[2i], x[2i+1]) as complex numbers times e^{i m theta_i}
    angles = torch.outer(
        torch.arange(seq, dtype=torch.float64),
        theta ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim),
    )  # (seq, head_dim / 2)
    rotation = torch.polar(torch.ones_like(angles), angles).unsqueeze(1)  # (seq, 1, d/2)
    reference = torch.view_as_real(torch.view_as_complex(x.unflatten(-1, (-1, 2))) * rotation)
    torch.testing.assert_close(ours, reference.flatten(-2), rtol=1e-12, atol=1e-12)
    # a rotation keeps every pair's length
    torch.testing.assert_close(ours.norm(dim=-1), x.norm(dim=-1), rtol=1e-12, atol=1e-12)


def test_rope_scores_depend_only_on_the_offset():
    torch.manual_seed(0)
    seq, head_dim = 12, 16
    q, k = torch.randn(head_dim, dtype=torch.float64), torch.randn(head_dim, dtype=torch.float64)
    cos, sin = rope_angles(seq, head_dim, dtype=torch.float64)

    def score(m: int, n: int) -> float:
        rotated_q = apply_rope(q, cos[m], sin[m])
        rotated_k = apply_rope(k, cos[n], sin[n])
        return float(rotated_q @ rotated_k)

    for offset in (0, 1, 3):
        scores = [score(m + offset, m) for m in range(seq - offset)]
        assert max(scores) - min(scores) < 1e-12, (offset, scores)
    assert abs(score(3, 0) - score(1, 0)) > 1e-3  # and it does depend on the offset


def test_rope_pairings_are_one_permutation_of_the_weights_apart():
    """Adjacent pairs (ours) vs split halves (GPT-NeoX, Hugging Face): permuting each head's
    dimensions of W_q and W_k turns one into the other, with the same scores."""
    torch.manual_seed(0)
    seq, head_dim = 6, 8
    q, k = torch.randn(seq, head_dim, dtype=torch.float64), torch.randn(seq, head_dim).double()
    cos, sin = rope_angles(seq, head_dim, dtype=torch.float64)

    def halves(x: torch.Tensor) -> torch.Tensor:  # (x[i], x[i + d/2]) rotated together
        first, second = x[..., : head_dim // 2], x[..., head_dim // 2 :]
        return torch.cat((first * cos - second * sin, first * sin + second * cos), dim=-1)

    to_halves = torch.cat((torch.arange(0, head_dim, 2), torch.arange(1, head_dim, 2)))
    ours = apply_rope(q, cos, sin) @ apply_rope(k, cos, sin).T  # (seq, seq)
    theirs = halves(q[:, to_halves]) @ halves(k[:, to_halves]).T
    torch.testing.assert_close(ours, theirs, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("kind", ["swiglu", "relu2", "gelu"])
def test_mlp_matches_its_formula(kind):
    torch.manual_seed(0)
    shape = replace(TINY, mlp=kind, bias=False)
    mlp = TransformerMLP(shape, dropout=0.0).double()
    x = torch.randn(2, 5, shape.d_model, dtype=torch.float64)
    up = mlp.fc.weight  # (d_ff or 2 d_ff, d_model)
    if kind == "swiglu":
        w1, w3 = up[: shape.d_ff], up[shape.d_ff :]
        hidden = F.silu(x @ w1.T) * (x @ w3.T)  # Shazeer 2020: (Swish(x W1) * x W3) W2
    elif kind == "relu2":
        hidden = torch.clamp(x @ up.T, min=0) ** 2
    else:
        hidden = F.gelu(x @ up.T)
    torch.testing.assert_close(mlp(x), hidden @ mlp.proj.weight.T, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("kv_heads", [4, 2, 1])
def test_grouped_query_attention_matches_sdpa_enable_gqa(kv_heads):
    if "enable_gqa" not in F.scaled_dot_product_attention.__doc__:
        pytest.skip(f"torch {torch.__version__} has no enable_gqa in SDPA (added in 2.5)")
    torch.manual_seed(0)
    shape = replace(TINY, n_kv_heads=kv_heads, bias=False)
    x = torch.randn(shape.batch_size, shape.seq_len, shape.d_model, dtype=torch.float64)
    for attention in ("manual", "sdpa"):
        torch.manual_seed(1)
        layer = CausalSelfAttention(shape, attention, dropout=0.0).double()
        kv_dim = shape.kv_dim
        q, k, v = layer.qkv(x).split((shape.d_model, kv_dim, kv_dim), dim=2)
        heads = (shape.batch_size, shape.seq_len, -1, shape.head_dim)
        q, k, v = (t.reshape(heads).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        reference = layer.proj(y.transpose(1, 2).reshape_as(x))
        torch.testing.assert_close(layer(x), reference, rtol=1e-10, atol=1e-12)


def test_manual_and_sdpa_attention_agree_for_the_modern_model():
    torch.manual_seed(0)
    manual = Transformer(MODERN, attention="manual").double()
    sdpa = Transformer(MODERN, attention="sdpa").double()
    sdpa.load_state_dict(manual.state_dict())
    tokens, targets = random_batch(MODERN)
    torch.testing.assert_close(manual.loss(tokens, targets), sdpa.loss(tokens, targets))


def test_zero_init_projections_make_every_block_the_identity():
    torch.manual_seed(0)
    model = Transformer(MODERN, zero_init_projections=True)
    x = torch.randn(MODERN.batch_size, MODERN.seq_len, MODERN.d_model)
    for block in model.blocks:
        torch.testing.assert_close(block(x), x)
    assert all(int(b.attn.proj.weight.count_nonzero()) == 0 for b in model.blocks)
    plain = Transformer(MODERN)
    assert float(plain.blocks[0].mlp.proj.weight.detach().std()) == pytest.approx(
        0.02 / math.sqrt(2 * MODERN.n_layers), rel=0.25
    )


def test_untied_head_has_its_own_matrix_and_tied_shares_one():
    tied = Transformer(TINY)
    assert tied.lm_head.weight is tied.token_embedding.weight
    untied = Transformer(replace(TINY, tied_head=False))
    assert untied.lm_head.weight is not untied.token_embedding.weight


def test_the_modern_model_learns_a_pattern_on_cpu():
    """A repeating sequence: the next token is predictable from the context after one period."""
    torch.manual_seed(0)
    shape = replace(MODERN, batch_size=8)
    model = Transformer(shape, attention="sdpa", zero_init_projections=True)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    period = torch.randint(shape.vocab_size, (shape.batch_size, 4))
    sequence = period.repeat(1, shape.seq_len // 4 + 1)  # (batch, > seq + 1)
    tokens, targets = sequence[:, : shape.seq_len], sequence[:, 1 : shape.seq_len + 1]
    first = float(model.loss(tokens, targets))
    for _ in range(60):
        optimizer.zero_grad()
        loss = model.loss(tokens, targets)
        loss.backward()
        optimizer.step()
    assert first > 4.0 and float(loss) < 0.5 * first, (first, float(loss))


# --------------------------------------------------------------------------- bad configurations


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"n_kv_heads": 3}, "n_kv_heads: 3"),
        ({"n_kv_heads": 0}, "n_kv_heads: 0"),
        ({"norm": "batchnorm"}, "norm: 'batchnorm'"),
        ({"mlp": "swish"}, "mlp: 'swish'"),
        ({"positions": "alibi"}, "positions: 'alibi'"),
        ({"qk_norm": "yes"}, "qk_norm: 'yes'"),
        ({"rope_theta": float("inf")}, "rope_theta: inf"),
        ({"norm_eps": 0}, "norm_eps: 0"),
    ],
)
def test_bad_configurations_name_the_value(changes, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        replace(TINY, **changes)


def test_an_odd_head_dimension_cannot_rotate():
    with pytest.raises(ValueError, match="head dimension for rotary positions: 5"):
        TransformerShape(10, 10, 1, 2, 8, 4, 1, positions="rope")
    TransformerShape(10, 10, 1, 2, 8, 4, 1)  # learned positions do not care


# --------------------------------------------------------------------------- costs, exactly


@pytest.mark.parametrize("shape", VARIANTS, ids=lambda s: f"{s.norm}-{s.positions}-{s.mlp}")
def test_parameters_and_flops_are_exact_for_every_choice(shape):
    torch.manual_seed(0)
    model = Transformer(shape)
    assert parameter_count(shape) == sum(p.numel() for p in model.parameters())
    tokens, targets = random_batch(shape)
    assert counted_flops(lambda: model.loss(tokens, targets).backward()) == training_flops(shape)


def _unmodelled(shape: TransformerShape) -> int:
    """What autograd keeps that the formula leaves out (fp32, on CPU): the norms' statistics
    (LayerNorm's mean and 1/std, RMSNorm's 1/rms, QK-norm's per head), the token ids, the
    targets and the position ids (int64), and the loss's 0-dim total weight."""
    norms = 2 * shape.n_layers + 1
    stats = norms * shape.tokens * (2 if shape.norm == "layernorm" else 1)
    if shape.qk_norm:
        stats += shape.n_layers * shape.tokens * (shape.n_heads + shape.kv_heads)
    positions = shape.seq_len if shape.positions == "learned" else 0
    return 4 * stats + 8 * (2 * shape.tokens + positions) + 4


@pytest.mark.parametrize("attention", ["manual", "sdpa"])
def test_activation_bytes_are_exact_for_every_choice(attention):
    for shape in VARIANTS:
        torch.manual_seed(0)
        model = Transformer(shape, attention=attention)
        tokens, targets = random_batch(shape)
        not_activations = [*model.parameters(), *model.buffers()]
        step = lambda m=model, x=tokens, y=targets: m.loss(x, y)  # noqa: E731
        measured = saved_tensor_bytes(step, exclude=not_activations)
        formula = model_activation_bytes(shape, value_bytes=4, attention=attention)
        assert measured == formula + _unmodelled(shape), shape


@pytest.mark.parametrize(
    ("name", "published"),
    [
        # Touvron et al. 2023 (Llama 2), "7B"; the released checkpoint has 6,738,415,616
        ("llama2-7b", 6.74e9),
        # Llama Team 2024 (The Llama 3 Herd of Models), Table 3: "8B" and "405B"
        ("llama3-8b", 8.03e9),
        ("llama3-405b", 405.9e9),
        # Radford et al. 2019: GPT-2 small, 124M counted exactly
        ("gpt2-small", 124.4e6),
    ],
)
def test_presets_have_their_published_parameter_counts(name, published):
    shape = PRESET_SHAPES[name]
    with torch.device("meta"):  # no memory: a 405B model of shapes only
        model = Transformer(shape)
    counted = sum(p.numel() for p in model.parameters())
    assert counted == parameter_count(shape)
    assert counted == pytest.approx(published, rel=5e-3)


def test_llama3_uses_grouped_query_attention_and_untied_embeddings():
    shape = PRESET_SHAPES["llama3-405b"]
    assert (shape.n_heads, shape.kv_heads, shape.head_dim) == (128, 8, 128)
    assert (shape.norm, shape.positions, shape.mlp) == ("rmsnorm", "rope", "swiglu")
    assert not shape.tied_head and not shape.bias and shape.rope_theta == 500_000


def test_rotary_angles_stay_float32_when_the_model_is_cast():
    model = Transformer(MODERN).to(torch.bfloat16)
    attention = model.blocks[0].attn
    assert attention.cos.dtype == torch.float32 and attention.sin.dtype == torch.float32
    cos, _ = rope_angles(MODERN.seq_len, MODERN.head_dim, MODERN.rope_theta)
    torch.testing.assert_close(attention.cos, cos)
    assert model.blocks[0].attn.qkv.weight.dtype == torch.bfloat16
    tokens, targets = random_batch(MODERN)
    assert torch.isfinite(model.loss(tokens, targets))


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: rope_angles(4, 3), "head_dim: 3"),
        (lambda: rope_angles(4, 8, theta=-1.0), "theta: -1.0"),
        (lambda: rope_angles(0, 8), "seq_len: 0"),
        (lambda: RMSNorm(8, eps=0.0), "eps: 0.0"),
    ],
)
def test_bad_rope_and_norm_arguments_name_the_value(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_the_layers_do_not_import_the_model():
    """The model imports its layers and its shape; the layers import the shape only (not even
    for their type hints), so the two modules are not an import circle."""
    import ast
    from pathlib import Path

    import trainfast.transformer_layers as layers

    tree = ast.parse(Path(layers.__file__).read_text())
    imported = {
        node.module if isinstance(node, ast.ImportFrom) else alias.name
        for node in ast.walk(tree)
        if isinstance(node, (ast.Import, ast.ImportFrom))
        for alias in node.names
    }
    assert "trainfast.transformer" not in imported, sorted(imported)
    assert "trainfast.transformer_shape" in imported
