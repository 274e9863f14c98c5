import math

import pytest
import torch

from swarm_runtime.train.losses import bradley_terry_loss, pair_weights, per_agent_advantages, reinforce_loss


def test_per_agent_mean_baseline():
    adv = per_agent_advantages([1.0, 3.0, 10.0, 4.0], [0, 0, 1, 2])
    assert adv == pytest.approx([-1.0, 1.0, 0.0, 0.0])


def test_reinforce_loss_value_and_gradient_direction():
    logp = torch.tensor([-1.0, -2.0], requires_grad=True)
    adv = torch.tensor([2.0, -1.0])
    loss = reinforce_loss(logp, adv)
    assert float(loss.detach()) == pytest.approx(-(2 * -1 + -1 * -2) / 2)
    loss.backward()
    # descending the loss raises log-prob of the positive-advantage sample, lowers the other
    assert logp.grad[0] < 0 < logp.grad[1]


def test_bradley_terry_hand_computed():
    lw, ll = torch.tensor([0.0]), torch.tensor([0.0])
    assert float(bradley_terry_loss(lw, ll)) == pytest.approx(math.log(2))
    lw, ll = torch.tensor([-0.5], requires_grad=True), torch.tensor([-1.5], requires_grad=True)
    loss = bradley_terry_loss(lw, ll)
    assert float(loss.detach()) == pytest.approx(-math.log(1 / (1 + math.exp(-1.0))))
    loss.backward()
    assert lw.grad[0] < 0 < ll.grad[0]


def test_weighted_bradley_terry_and_pair_weights():
    lw, ll = torch.tensor([0.0, -1.0]), torch.tensor([0.0, 0.0])
    per_pair = [math.log(2), -math.log(1 / (1 + math.exp(1.0)))]
    assert float(bradley_terry_loss(lw, ll, torch.tensor([1.0, 1.0]))) == pytest.approx(sum(per_pair) / 2)
    assert float(bradley_terry_loss(lw, ll, torch.tensor([0.5, 1.5]))) == pytest.approx(
        (0.5 * per_pair[0] + 1.5 * per_pair[1]) / 2)
    assert pair_weights([0.3, -2.0], "uniform") == [1.0, 1.0]
    # margin: |score difference| normalised to mean 1, so one +1.2 win outweighs three -0.2 losses
    w = pair_weights([1.2, -0.2, -0.2, -0.2], "margin")
    assert w == pytest.approx([8 / 3, 4 / 9, 4 / 9, 4 / 9]) and sum(w) == pytest.approx(4)
    assert pair_weights([], "margin") == []
    with pytest.raises(ValueError, match="'median'; valid: uniform, margin"):
        pair_weights([1.0], "median")


def test_losses_follow_the_device_of_the_log_probs():
    """Advantages and pair weights are built on the CPU; the log-probs live on the model's device
    (a GPU). The ``meta`` device stands in for it here: mixing devices would raise."""
    logp = torch.zeros(3, device="meta")
    assert reinforce_loss(logp, torch.tensor([1.0, -1.0, 0.5])).device.type == "meta"
    assert bradley_terry_loss(logp, logp, torch.tensor([1.0, 2.0, 0.5])).device.type == "meta"
