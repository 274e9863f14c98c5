"""fp32 master weights for models loaded in bfloat16 (``model=local``'s default dtype)."""

import math

import torch

from swarm_runtime.learn.optim import MasterWeightAdamW, clip_and_step, make_optimizer


def _weights(seed=0):
    g = torch.Generator().manual_seed(seed)
    return 0.02 + 0.01 * torch.rand(64, generator=g)  # magnitudes of typical LLM weights


def _train(param, opt, sched, grads):
    for g in grads:
        param.grad = g.to(param.dtype).clone()
        clip_and_step([param], opt, sched, 1e9)


def test_small_steps_survive_in_bfloat16_through_the_master_copy():
    grads = [torch.full((64,), 0.5)] * 10
    ref = torch.nn.Parameter(_weights().bfloat16().float())  # fp32 training from the same start
    _train(ref, *make_optimizer([ref], 1e-5, 0.0, 100), grads)
    naive = torch.nn.Parameter(_weights().bfloat16())  # bf16 weights stepped directly: every step rounds away
    opt = torch.optim.AdamW([naive], lr=1e-5, betas=(0.9, 0.95), eps=1e-8)
    _train(naive, opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0), grads)
    assert torch.equal(naive.detach(), _weights().bfloat16())
    p = torch.nn.Parameter(_weights().bfloat16())
    opt, sched = make_optimizer([p], 1e-5, 0.0, 100)
    assert isinstance(opt, MasterWeightAdamW)
    _train(p, opt, sched, grads)
    master = p._swarm_master
    torch.testing.assert_close(master, ref.detach(), atol=1e-6, rtol=0)  # the master follows fp32 training
    assert torch.equal(p.detach(), master.bfloat16())  # the weights are the master, rounded
    assert not torch.equal(p.detach(), _weights().bfloat16())


def test_two_optimizers_of_one_model_share_its_master_and_see_outside_changes():
    """MPT steps a role's weights with an action optimizer and a bid optimizer; neither may undo
    the other's update, and weights changed outside them (a checkpoint load) are picked up."""
    p = torch.nn.Parameter(_weights().bfloat16())
    a, sa = make_optimizer([p], 1e-3, 0.0, 100)
    b, sb = make_optimizer([p], 1e-3, 0.0, 100)
    _train(p, a, sa, [torch.ones(64)])
    after_a = p._swarm_master.clone()
    assert (after_a < _weights() - 5e-4).all()
    _train(p, b, sb, [-torch.ones(64)])
    assert torch.allclose(p._swarm_master, after_a + 1e-3, atol=1e-5)  # from where a left it, not from the start
    with torch.no_grad():
        p.fill_(0.5)
    _train(p, a, sa, [torch.zeros(64)])
    assert torch.allclose(p._swarm_master, torch.full((64,), 0.5), atol=1e-3)


def test_master_weight_optimizer_state_round_trips():
    p = torch.nn.Parameter(_weights().bfloat16())
    opt, sched = make_optimizer([p], 1e-4, 0.0, 10)
    _train(p, opt, sched, [torch.ones(64)] * 3)
    state = opt.state_dict()
    q = torch.nn.Parameter(p.detach().clone())
    opt2, _ = make_optimizer([q], 1e-4, 0.0, 10)
    opt2.load_state_dict(state)
    assert torch.equal(opt2.state_dict()["state"][0]["exp_avg"], state["state"][0]["exp_avg"])
    assert opt2.state[q._swarm_master]["exp_avg"].dtype == torch.float32


def test_masters_are_checkpointed_and_restored_in_place():
    from swarm_runtime.models.masters import master_weights, restore_master_weights

    fp32 = torch.nn.Parameter(torch.ones(3))
    assert master_weights([fp32]) is None
    p = torch.nn.Parameter(_weights().bfloat16())
    opt, sched = make_optimizer([p, fp32], 1e-5, 0.0, 100)
    _train(p, opt, sched, [torch.ones(64)] * 3)
    saved = [m.clone() if m is not None else None for m in master_weights([p, fp32])]
    assert saved[1] is None and not torch.equal(saved[0].bfloat16().float(), saved[0])  # sub-bf16 progress
    q = torch.nn.Parameter(p.detach().clone())  # a resumed run: the checkpoint's rounded weights
    opt2, _ = make_optimizer([q], 1e-5, 0.0, 100)
    live = q._swarm_master
    restore_master_weights([q], saved[:1])
    assert q._swarm_master is live and torch.equal(live, saved[0])
    assert opt2.param_groups[0]["params"][0] is live


def test_a_resumed_optimizer_keeps_the_configured_lr_and_eps_but_the_saved_moments():
    """``load_state_dict`` alone would bring back the checkpoint's learning rate: a run resumed
    after its config changed ``algo.lr`` would silently train at the old one."""
    from swarm_runtime.learn.optim import load_optimizer_state

    p = torch.nn.Parameter(torch.ones(4))
    opt, sched = make_optimizer([p], 3e-5, 0.0, 10, eps=1e-4)
    _train(p, opt, sched, [torch.ones(4)] * 2)
    saved_opt, saved_sched = opt.state_dict(), sched.state_dict()
    q = torch.nn.Parameter(p.detach().clone())
    opt2, sched2 = make_optimizer([q], 3e-4, 0.0, 10, eps=1e-8)
    changed = load_optimizer_state(opt2, sched2, saved_opt, saved_sched)
    assert changed == {"lr": (3e-5, 3e-4), "eps": (1e-4, 1e-8)}

    def cosine(step):  # make_optimizer's schedule over 10 steps, floor 0.1
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * step / 10))

    assert sched2.last_epoch == 2 and math.isclose(opt2.param_groups[0]["lr"], 3e-4 * cosine(2))
    assert torch.equal(opt2.state[q]["exp_avg"], opt.state[p]["exp_avg"])  # the moments carry over
    _train(q, opt2, sched2, [torch.ones(4)])
    assert math.isclose(sched2.get_last_lr()[0], 3e-4 * cosine(3))
    same_opt, same_sched = make_optimizer([torch.nn.Parameter(torch.ones(4))], 3e-5, 0.0, 10, eps=1e-4)
    assert load_optimizer_state(same_opt, same_sched, saved_opt, saved_sched) == {}
