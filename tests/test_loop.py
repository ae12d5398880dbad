"""The smallest training loop (trainfast.loop) that the optimizers chapter shows."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from trainfast.datasets import digits
from trainfast.loop import evaluate, train


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))


def test_training_lowers_the_test_loss_and_counts_examples():
    train_set, test_set = digits("train"), digits("test")
    model = _model()
    before, _ = evaluate(model, test_set)
    history = train(
        model, torch.optim.SGD(model.parameters(), lr=0.1), train_set, batch_size=32, steps=300
    )
    after, accuracy = evaluate(model, test_set)
    assert history.steps == 300
    per_epoch = -(-len(train_set) // 32)  # 45 steps, the last one a partial batch
    epochs, rest = divmod(300, per_epoch)
    assert history.examples[-1] == epochs * len(train_set) + rest * 32
    assert after < 0.5 * before and accuracy > 0.8
    assert history.seconds == sorted(history.seconds)


def test_full_batch_and_more_steps_than_one_epoch():
    train_set = digits("train")
    model = _model()
    history = train(
        model,
        torch.optim.SGD(model.parameters(), lr=0.1),
        train_set,
        batch_size=len(train_set),
        steps=3,
    )
    assert history.examples == [len(train_set) * k for k in (1, 2, 3)]


def test_train_matches_a_hand_written_loop():
    train_set = digits("train")
    ours, reference = _model(), _model()
    train(
        ours, torch.optim.SGD(ours.parameters(), lr=0.1), train_set, batch_size=50, steps=40, seed=3
    )
    optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)
    loader = torch.utils.data.DataLoader(
        train_set, batch_size=50, shuffle=True, generator=torch.Generator().manual_seed(3)
    )
    steps = 0
    while steps < 40:
        for x, y in loader:
            optimizer.zero_grad()
            nn.functional.cross_entropy(reference(x), y).backward()
            optimizer.step()
            steps += 1
            if steps == 40:
                break
    for a, b in zip(ours.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_evaluate_restores_training_mode():
    model = _model()
    model.train()
    evaluate(model, digits("test"))
    assert model.training


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"batch_size": 0, "steps": 1}, "batch_size: 0"),
        ({"batch_size": 8, "steps": -1}, "steps: -1"),
    ],
)
def test_bad_arguments_name_the_value(kwargs, message):
    model = _model()
    with pytest.raises(ValueError, match=message):
        train(model, torch.optim.SGD(model.parameters(), lr=0.1), digits("train"), **kwargs)


def test_digits_split_is_fixed_and_disjoint():
    a, b = digits("train"), digits("test")
    assert len(a) + len(b) == 1797
    assert digits("train").tensors[0].equal(a.tensors[0])
    assert digits("test", images=True).tensors[0].shape[1:] == (1, 8, 8)
    with pytest.raises(ValueError, match="'validation'"):
        digits("validation")


def test_evaluate_returns_an_evaluation_that_unpacks():
    from trainfast.loop import Evaluation

    model = nn.Sequential(nn.Linear(64, 10))
    result = evaluate(model, digits("test"))
    assert isinstance(result, Evaluation)
    loss, accuracy = result
    assert (loss, accuracy) == (result.loss, result.accuracy) and 0.0 <= accuracy <= 1.0
    assert result.as_metrics() == {"eval/loss": loss, "eval/accuracy": accuracy}
