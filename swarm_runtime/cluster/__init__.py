"""A run's actors on Ray (docs/guides/ray.md; docs/reference/cluster.md). ``cluster.kind=ray`` runs a run's
rollout, evaluation and branch envs in ``cluster.env_workers`` Ray actors (:mod:`.env_worker`), driven from the
trainer (:mod:`.env_cluster`); ``cluster.kind=local`` (the default): in process. Learners (:mod:`.learners`,
:mod:`.sharded_learners`), the sampler (:mod:`.samplers`) and engine sampler actors (:mod:`.vllm_actors`) go on Ray by
their own settings. Every family is an :class:`~swarm_runtime.cluster.actors.ActorGroup` (:mod:`.actors`) over the Ray
helpers of :mod:`.ray_helpers`; :mod:`.placement` reserves their placement groups, :mod:`.actor_env` gives a joined
cluster's actors the run's variables."""

from __future__ import annotations

from contextlib import contextmanager

KINDS = ("local", "ray")


def env_domain(cfg, domain):
    """``(domain, cluster)``: the domain whose ``make_env`` the run's episodes use, and the cluster to close at
    the end (None: ``cluster.kind=local``, the domain itself)."""
    c = cfg.get("cluster")
    if c is None or c.kind == "local":
        return domain, None
    from swarm_runtime.cluster.actor_env import forward_env
    from swarm_runtime.cluster.env_cluster import ClusterDomain, EnvCluster
    from swarm_runtime.cluster.placement import node_resources, plan_and_placement

    forward_env(cfg, domain)  # the run's variables, for the actors of a joined cluster

    spec = plan_and_placement(cfg, domain)[1] if c.get("placement", "none") != "none" else None
    cluster = EnvCluster(
        cfg.domain,
        cfg.task,
        int(c.env_workers),
        c.address,
        c.get("num_cpus"),
        placement=spec,
        placement_wait_s=float(c.get("placement_wait_s", 30.0)),
        options=node_resources(cfg, "env"),
        restart_wait_s=restart_wait_s(cfg),
    )
    return ClusterDomain(domain, cluster), cluster


def restart_wait_s(cfg) -> float:
    """``cluster.restart_wait_s`` of ``cfg`` (how long a dead actor is waited for), its default where the config has no
    cluster section (every actor group is given it: :class:`~swarm_runtime.cluster.env_cluster.EnvCluster`,
    ``RaySampler``, ``LearnerGroup``)."""
    from swarm_runtime.cluster.actors import RESTART_WAIT_S

    c = cfg.get("cluster")
    return float(c.get("restart_wait_s", RESTART_WAIT_S)) if c is not None else RESTART_WAIT_S


def close_cluster(cluster) -> None:
    """Close ``cluster`` (None: nothing to close) and log its workers' stats."""
    if cluster is not None:
        from loguru import logger

        logger.info("env workers closed: {}", cluster.close())


@contextmanager
def env_workers(cfg, domain):
    """:func:`env_domain` for the body (``swarm eval``), its cluster closed at the end, also when it raised."""
    envs, cluster = env_domain(cfg, domain)
    try:
        yield envs
    finally:
        close_cluster(cluster)
