import math

import pytest
import torch

from swarm_runtime.learn.losses import bradley_terry_loss, pair_weights, per_agent_advantages, reinforce_loss


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
        (0.5 * per_pair[0] + 1.5 * per_pair[1]) / 2
    )
    assert pair_weights([0.3, -2.0], "uniform") == [1.0, 1.0]
    # margin: |score difference| normalised to mean 1, so one +1.2 win outweighs three -0.2 losses
    w = pair_weights([1.2, -0.2, -0.2, -0.2], "margin")
    assert w == pytest.approx([8 / 3, 4 / 9, 4 / 9, 4 / 9]) and sum(w) == pytest.approx(4)
    assert pair_weights([], "margin") == []
    with pytest.raises(ValueError, match="'median'; valid: uniform, margin"):
        pair_weights([1.0], "median")


def test_bradley_terry_against_a_reference_is_the_dpo_form():
    """``algo.bid_reference``: the log-odds are measured against a reference policy's, scaled by beta."""
    lw, ll = torch.tensor([-0.5]), torch.tensor([-1.5])
    rw, rl = torch.tensor([-0.7]), torch.tensor([-1.2])
    z = (-0.5 - -1.5) - (-0.7 - -1.2)
    for beta in (1.0, 0.5):
        assert float(bradley_terry_loss(lw, ll, None, rw, rl, beta=beta)) == pytest.approx(
            math.log1p(math.exp(-beta * z))
        )
    # the policy at the reference: every pair sits at log 2, whatever its log-odds
    assert float(bradley_terry_loss(lw, ll, None, lw, ll)) == pytest.approx(math.log(2))
    with pytest.raises(ValueError, match="both reference log-probs"):
        bradley_terry_loss(lw, ll, None, rw)


def test_pairs_that_split_evenly_flatten_confident_bids_unless_measured_against_a_reference():
    """Two pairs of a confident policy (log pi: high bid -0.1, low bid -3), one won by each bid (noise).
    The paper's loss weighs the pair that disagrees with the policy ~18x more, so a step lowers the high
    bid's odds; against a reference equal to the policy the two gradients cancel exactly."""
    hi, lo = -0.1, -3.0
    grads = {}
    for ref in (False, True):
        lw = torch.tensor([hi, lo], requires_grad=True)  # winners: the high bid, then the low bid
        ll = torch.tensor([lo, hi], requires_grad=True)
        refs = (lw.detach().clone(), ll.detach().clone()) if ref else (None, None)
        bradley_terry_loss(lw, ll, None, *refs).backward()
        # d loss / d log pi(high) and d loss / d log pi(low), summed over both pairs
        grads[ref] = (float(lw.grad[0] + ll.grad[1]), float(lw.grad[1] + ll.grad[0]))
    d_high, d_low = grads[False]
    assert d_high > 0.2 and d_low < -0.2  # descent lowers the high bid, raises the low one
    assert grads[True] == pytest.approx((0.0, 0.0), abs=1e-7)


def test_losses_follow_the_device_of_the_log_probs():
    """Advantages and pair weights are built on the CPU; the log-probs live on the model's device
    (a GPU). The ``meta`` device stands in for it here: mixing devices would raise."""
    logp = torch.zeros(3, device="meta")
    assert reinforce_loss(logp, torch.tensor([1.0, -1.0, 0.5])).device.type == "meta"
    assert bradley_terry_loss(logp, logp, torch.tensor([1.0, 2.0, 0.5])).device.type == "meta"
    assert bradley_terry_loss(logp, logp, None, torch.zeros(3), torch.zeros(3)).device.type == "meta"
