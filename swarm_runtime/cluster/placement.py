"""Placement groups per agent group (docs/guides/sharded-learners.md, "Placement and sizing").

:func:`make_placement` is a pure function from the config, the roles and the memory plan to a
:class:`PlacementSpec`: per agent group (a role with its full copy, or a base with its roles' adapters:
``memory_plan.agent_groups``) one Ray placement group whose bundles are devices: ``train.shards`` for the
learner's shards, with the sampler on the first (``cluster.placement=colocated``) or on one more of its own
(``split``), one sampler slot per replica of ``cluster.sampler_replicas`` (:func:`make_placement`); and an ``envs``
group, one bundle per env worker. A bundle is ``{"CPU": cluster.cpus_per_bundle}``, plus ``{"GPU": 1}`` on
``hardware.device=cuda`` (a sampler's own bundle: its server's GPUs, :func:`sampler_gpus`); the plan's bytes of the
busiest device sit beside each.

:func:`reserve` reserves the groups on Ray before anything trains (a group not placed within
``cluster.placement_wait_s`` is a :class:`ConfigError` naming the bundles asked and the resources Ray has), and
:func:`actor_options` gives the ``.options(...)`` of an actor in its group's bundle (the env workers here;
learner and sampler actors the same way). The actors that share a bundle split its resources evenly.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from swarm_runtime.config.checks_engine import server_gpus  # the parallel sizes' product (checked at validation)
from swarm_runtime.config.errors import ConfigError
from swarm_runtime.models.memory_plan import GiB, PlacedPlan, agent_groups

#: The actors of a placement: a learner shard, a sampler, an env worker.
ACTORS = ("learner", "sampler", "env")
#: The group of the env workers.
ENVS = "envs"
#: Ray's resources a message shows (the rest: ``node:...``, memory, object store, accelerator labels).
SHOWN = ("CPU", "GPU")


@dataclass(frozen=True)
class GroupPlacement:
    """One placement group: its bundles (Ray resources each) and, per actor kind, the bundle of each actor."""

    name: str  #: the role (full copies), the base (adapters), or ``envs``
    roles: tuple[str, ...]  #: the agent roles it trains and samples (none for ``envs``)
    bundles: tuple[dict, ...]
    actors: dict  #: actor kind -> the bundle index of each actor of that kind (learner shard i, env worker i)
    strategy: str = "PACK"  #: Ray's: a learner group's devices on as few nodes as fit (its collectives)
    gib: tuple = ()  #: per bundle: the plan's GiB of that device (None: not planned, a CPU-only bundle)

    def share(self, bundle: int) -> int:
        """Actors placed in ``bundle``."""
        return sum(list(ix).count(bundle) for ix in self.actors.values())


@dataclass
class PlacementSpec:
    kind: str  #: ``colocated`` or ``split``
    groups: list[GroupPlacement]
    pgs: dict = field(default_factory=dict, compare=False)  #: group name -> Ray placement group, once reserved

    def group(self, name: str) -> GroupPlacement:
        for g in self.groups:
            if g.name == name:
                return g
        raise ConfigError(f"no placement group {name!r}; valid: {', '.join(g.name for g in self.groups)}")

    def totals(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for g in self.groups:
            for b in g.bundles:
                for k, v in b.items():
                    out[k] = out.get(k, 0) + v
        return out

    def asked(self) -> str:
        """The bundles asked, per group: ``Smith: 2 x {CPU: 1, GPU: 1}; envs: 2 x {CPU: 1}``."""
        parts = []
        for g in self.groups:
            kinds: dict[str, int] = {}
            for b in g.bundles:
                kinds[_res(b)] = kinds.get(_res(b), 0) + 1
            parts.append(f"{g.name}: " + " + ".join(f"{n} x {k}" for k, n in kinds.items()))
        return "; ".join(parts) + f" (in all {_res(self.totals())})"

    def format(self) -> str:
        lines = [f"placement ({self.kind}): {len(self.groups)} placement groups, {_res(self.totals())} in all"]
        for g in self.groups:
            roles = f" (roles {', '.join(g.roles)})" if g.roles and list(g.roles) != [g.name] else ""
            lines.append(f"  group {g.name}{roles}, {g.strategy}:")
            for i, b in enumerate(g.bundles):
                who = [
                    f"{k} {j}" if len(ix) > 1 else k for k, ix in g.actors.items() for j, x in enumerate(ix) if x == i
                ]
                gib = g.gib[i] if i < len(g.gib) else None
                planned = f"  ~{gib:.1f} GiB planned" if gib is not None else ""
                lines.append(f"    bundle {i}: {_res(b):<20} {', '.join(who)}{planned}")
        return "\n".join(lines)


def _res(resources: dict) -> str:
    shown = {k: v for k, v in resources.items() if k in SHOWN or not _internal(k)}
    return "{" + ", ".join(f"{k}: {v:g}" for k, v in sorted(shown.items())) + "}"


def _internal(key: str) -> bool:
    return (
        key.startswith(("node:", "accelerator_type:", "bundle_group_"))
        or "_group_" in key  # a placement group's own resources (CPU_group_<id>)
        or key in ("memory", "object_store_memory")
    )


def make_placement(cfg, roles: list[str], plan=None) -> PlacementSpec | None:
    """The placement of ``cluster.placement`` (None for ``none``): per agent group its learner's
    ``train.shards`` bundles and its sampler's, and the env workers' (``cluster.env_workers``). ``plan``: the
    run's memory plan (a :class:`PlacedPlan`), whose busiest device per bundle is shown beside it.

    Sampler replicas (``cluster.sampler_replicas=N``, :func:`placed_replicas`): one sampler slot per replica,
    replica ``j`` in slot ``j``: ``colocated``, replica ``j`` shares learner shard ``j``'s bundle (the replicas past
    the shards get a bundle of their own); ``split``, N sampler bundles after the shards'. On a CUDA profile a
    sampler's bundle holds the GPUs its server uses (:func:`sampler_gpus`: vLLM's tensor x pipeline parallel size;
    with ``colocated`` a server of more than one GPU is refused: the learner shard shares its device)."""
    c = cfg.cluster
    kind = str(c.get("placement", "none"))
    if kind == "none":
        return None
    shards = int(cfg.train.shards) if cfg.get("train") is not None else 1
    cpus = int(c.get("cpus_per_bundle", 1))
    cuda = str(cfg.hardware.device).startswith("cuda")
    device = {"CPU": cpus, "GPU": 1} if cuda else {"CPU": cpus}
    n = placed_replicas(cfg)
    gpus = sampler_gpus(cfg)
    if kind == "colocated" and gpus > 1:
        raise ConfigError(
            f"cluster.placement=colocated with a vLLM server of {gpus} GPUs (rollout.vllm.args' tensor/pipeline "
            "parallel sizes): a colocated sampler shares one device with a learner shard; valid: "
            "cluster.placement=split (the sampler's bundle holds its GPUs), or a server of one GPU"
        )
    alone = {"CPU": cpus, "GPU": max(1, gpus)} if cuda else {"CPU": cpus}  # a sampler's own bundle
    per = plan.per_group if isinstance(plan, PlacedPlan) else {}
    groups = []
    for g in agent_groups(cfg, list(roles)):
        mem = per.get(g.name, {})
        learner = tuple(range(shards))
        if kind == "colocated":
            both = min(n, shards)  # bundles with a learner shard and a sampler replica
            bundles = [dict(device) for _ in range(shards)] + [dict(alone) for _ in range(n - both)]
            gib = [mem.get("learner+sampler")] * both + [mem.get("learner")] * (shards - both)
            gib += [mem.get("sampler")] * (n - both)
        else:
            bundles = [dict(device) for _ in range(shards)] + [dict(alone) for _ in range(n)]
            gib = [mem.get("learner")] * shards + [mem.get("sampler")] * n
        groups.append(
            GroupPlacement(
                g.name,
                tuple(g.roles),
                tuple(bundles),
                {"learner": learner, "sampler": _sampler_slots(kind, shards, n)},
                "PACK",
                tuple(None if b is None else b / GiB for b in gib),
            )
        )
    n_env = int(c.env_workers)
    groups.append(
        GroupPlacement(ENVS, (), tuple({"CPU": cpus} for _ in range(n_env)), {"env": tuple(range(n_env))}, "SPREAD")
    )
    return PlacementSpec(kind, groups)


def _sampler_slots(kind: str, shards: int, n: int) -> tuple[int, ...]:
    """The bundle of each of ``n`` sampler replicas (:func:`make_placement`)."""
    if kind == "colocated":
        return tuple(range(n))  # shard j's bundle, then bundles of their own (numbered after the shards')
    return tuple(range(shards, shards + n))


def placed_replicas(cfg) -> int:
    """Sampler slots per agent group in a placement: ``cluster.sampler_replicas`` (an int; ``per_node`` is refused
    with a placement by config/validation.py, its count known only once Ray is asked)."""
    c = cfg.get("cluster")
    n = c.get("sampler_replicas", 1) if c is not None else 1
    return n if isinstance(n, int) and not isinstance(n, bool) and n > 1 else 1


def sampler_gpus(cfg) -> int:
    """The GPUs an engine sampler actor asks Ray for (``rollout.engine=vllm``; Ray then sets its
    ``CUDA_VISIBLE_DEVICES`` to the GPU ids it gave, which the actor's vLLM server inherits): its server's
    (:func:`server_gpus` of ``rollout.vllm.args``) on a CUDA profile (``hardware.device=cuda...``), 0 else."""
    if not str(cfg.hardware.device).startswith("cuda"):
        return 0
    r = cfg.get("rollout")
    if r is None or str(r.get("engine", "local")) != "vllm":
        return 0
    return server_gpus((r.get("vllm") or {}).get("args"))


def engine_actor_options(cfg, options: dict | None) -> dict:
    """``options`` of an engine sampler actor with its GPUs (:func:`sampler_gpus`) asked, unless a placement's
    bundle holds them (its ``scheduling_strategy`` a placement group's: :func:`actor_options` asked them already).
    Ray is not imported here: a local Ray is set to loopback before its first import (``cluster.ray_helpers.connect``)."""
    out = dict(options or {})
    if type(out.get("scheduling_strategy")).__name__ == "PlacementGroupSchedulingStrategy":
        return out
    gpus = sampler_gpus(cfg)
    if gpus:
        out["num_gpus"] = gpus
    return out


def plan_and_placement(cfg, domain):
    """The run's memory plan (:func:`swarm_runtime.models.memory_plan.make_plan`, its groups named after ``domain``'s
    roles) and its placement (None: ``cluster.placement=none``)."""
    from swarm_runtime.models.memory_plan import make_plan

    names = [r.name for r in domain.roles]
    vocab = None
    if cfg.model.get("arch") is None and cfg.model.get("path") is None:  # the built model: its vocabulary
        vocab = len(domain.all_words(cfg.task)) + 16
    plan = make_plan(cfg, len(names), len(names), vocab, roles=names)
    return plan, make_placement(cfg, names, plan)


def reserve(spec: PlacementSpec, wait_s: float) -> None:
    """Reserve every group of ``spec`` on the connected Ray (``spec.pgs``); a group not placed within
    ``wait_s`` seconds: all are removed again and a :class:`ConfigError` names the bundles asked and the
    resources Ray has (measured with Ray 2.60: a group no node can hold stays ``PENDING``, scheduling state
    ``NO_RESOURCES``; Ray never refuses it, so the wait is the test)."""
    import time

    from swarm_runtime.cluster.ray_helpers import import_ray

    ray = import_ray()
    from ray.util import placement_group

    for g in spec.groups:
        spec.pgs[g.name] = placement_group([dict(b) for b in g.bundles], strategy=g.strategy)
    end = time.monotonic() + float(wait_s)
    late = [n for n, pg in spec.pgs.items() if not pg.wait(max(0.0, end - time.monotonic()))]
    if late:
        available, whole = dict(ray.available_resources()), ray.cluster_resources()
        for g in spec.groups:  # what the groups placed already hold is Ray's to give again once they are removed
            if g.name not in late:
                for b in g.bundles:
                    for k, v in b.items():
                        available[k] = available.get(k, 0) + v
        state = _state(spec.pgs[late[0]])
        release(spec)
        raise ConfigError(
            f"cluster.placement={spec.kind}: Ray could not reserve the placement group"
            f"{'s' if len(late) > 1 else ''} of {', '.join(late)} within {float(wait_s):g} s "
            f"(cluster.placement_wait_s; Ray says {state}). Asked: {spec.asked()}; Ray has {_res(available)} available of "
            f"{_res(whole)}; give Ray more nodes or fewer train.shards, cluster.env_workers or "
            "cluster.cpus_per_bundle (or cluster.placement=none)"
        )
    from loguru import logger

    logger.info("placement ({}) reserved: {}", spec.kind, spec.asked())


def _state(pg) -> str:
    """A placement group's state as Ray reports it (2.60: a group no node can hold is ``PENDING``, scheduling
    state ``NO_RESOURCES``, for as long as one waits)."""
    try:
        from ray.util import placement_group_table

        t = placement_group_table(pg)
        return f"{t.get('state')}, {(t.get('stats') or {}).get('scheduling_state', '?')}"
    except Exception:  # the state is a courtesy: the error stands without it
        return "not reserved"


def release(spec: PlacementSpec | None) -> None:
    """Remove the placement groups :func:`reserve` made (their actors first: Ray kills those still in them)."""
    if spec is None or not spec.pgs:
        return
    from ray.util import remove_placement_group

    for pg in spec.pgs.values():
        try:
            remove_placement_group(pg)
        except Exception:  # Ray already shut down: nothing is held anymore
            pass
    spec.pgs.clear()


def actor_options(spec: PlacementSpec, group: str, role: str, index: int = 0) -> dict:
    """The ``.options(...)`` keywords of actor ``index`` of kind ``role`` (``learner`` shard, ``sampler``,
    ``env`` worker) of ``group``: in its bundle of the reserved placement group, asking its share of the
    bundle's CPUs and GPUs (the actors of a bundle split it evenly)."""
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    g = spec.group(group)
    if role not in g.actors:
        raise ConfigError(f"placement group {group!r} has no {role!r}; valid: {', '.join(g.actors)}")
    ix = g.actors[role]
    if not 0 <= index < len(ix):
        raise ConfigError(f"placement group {group!r} has {len(ix)} {role} slot(s); index {index} is not one")
    if group not in spec.pgs:
        raise RuntimeError(f"placement group {group!r} is not reserved yet (reserve(spec, ...) first)")
    bundle = ix[index]
    share = g.share(bundle)
    res = g.bundles[bundle]
    out = {
        "scheduling_strategy": PlacementGroupSchedulingStrategy(
            placement_group=spec.pgs[group], placement_group_bundle_index=bundle
        ),
        "num_cpus": res.get("CPU", 0) / share,
    }
    if res.get("GPU"):
        out["num_gpus"] = res["GPU"] / share
    return out


def bundles_in_use(spec: PlacementSpec, group: str) -> list[dict]:
    """Per bundle of ``group``'s reserved placement group: the resources its actors hold now, as Ray accounts them
    (a bundle's resources are Ray resources of their own, ``CPU_group_<bundle>_<group id>``: held = total -
    available)."""
    from swarm_runtime.cluster.ray_helpers import import_ray

    ray = import_ray()
    whole, free, pg = ray.cluster_resources(), ray.available_resources(), spec.pgs[group].id.hex()
    out = []
    for i, bundle in enumerate(spec.group(group).bundles):
        keys = {k: f"{k}_group_{i}_{pg}" for k in bundle}
        out.append({k: round(whole.get(key, 0) - free.get(key, 0), 6) for k, key in keys.items()})
    return out


#: Seconds :func:`check_learners_placed` waits for Ray's accounts of a bundle to show an actor's share (Ray's
#: resource view reaches the control store a little after the raylet grants it)
ACCOUNTS_WAIT_S = 10.0


def check_learners_placed(
    spec: PlacementSpec, ranks: dict[str, list], roles: dict[str, list], wait_s: float = ACCOUNTS_WAIT_S
) -> list[str]:
    """Check that each learner's ranks (``ranks``: learner -> the placement group id each rank reports from inside
    its actor, hex) run in the placement group of its roles (``roles``: learner -> its roles), and that the bundles
    hold what the placement gives them (:func:`bundles_in_use`, asked again for up to ``wait_s`` seconds; the
    learner's shares of bundles with no other actor running yet: a sampler's share stays free while the sampler runs
    in the trainer); a ``RuntimeError`` names the first that does not. Returns one line per learner for the log."""
    import time

    end = time.monotonic() + float(wait_s)
    while True:
        try:
            return _placed_lines(spec, ranks, roles)
        except _Short:
            if time.monotonic() > end:
                return _placed_lines(spec, ranks, roles, short=RuntimeError)
            time.sleep(0.2)


class _Short(RuntimeError):
    """A bundle that does not hold a rank's share (yet)."""


def _placed_lines(spec: PlacementSpec, ranks: dict, roles: dict, short: type = _Short) -> list[str]:
    lines = []
    for name, pgs in ranks.items():
        group = next((g.name for g in spec.groups if set(roles[name]) <= set(g.roles)), None)
        if group is None:
            raise RuntimeError(f"learner {name!r}: no placement group holds its roles {roles[name]}")
        want = spec.pgs[group].id.hex()
        for k, got in enumerate(pgs):
            if got != want:
                raise RuntimeError(
                    f"learner {name!r} rank {k} runs in placement group {got} (None: none), not in its group "
                    f"{group!r}'s {want}"
                )
        g, held = spec.group(group), bundles_in_use(spec, group)
        for k in range(len(pgs)):
            b = g.actors["learner"][k]
            asked = actor_options(spec, group, "learner", k)
            if held[b].get("CPU", 0) + 1e-6 < asked["num_cpus"]:
                raise short(
                    f"learner {name!r} rank {k}: its bundle {b} of placement group {group!r} holds {_res(held[b])}, "
                    f"less than the rank's share {{CPU: {asked['num_cpus']:g}}}"
                )
        lines.append(
            f"learner {name}: ranks {', '.join(map(str, range(len(pgs))))} in placement group {group} ({want}); "
            + ", ".join(f"bundle {i} holds {_res(h)} of {_res(g.bundles[i])}" for i, h in enumerate(held))
        )
    return lines


def replica_options(base: dict | None, node: str | None = None) -> dict:
    """The Ray ``.options(...)`` of one of a base's engine sampler replicas (``cluster.sampler_replicas``;
    sampling/replicas.py). ``base``: the options one sampler of the base would get. In a placement group (its
    ``scheduling_strategy`` is one): as they are (each replica its own bundle: :func:`make_placement`,
    ``actor_options(spec, group, "sampler", j)``); else ``node`` (Ray's node id: ``per_node``) pins it to that node,
    or (None) Ray's ``SPREAD`` strategy puts the replicas on as many nodes as it can."""
    out = dict(base or {})
    if out.get("scheduling_strategy") is not None:
        return out
    if node is not None:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        out["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node_id=node, soft=False)
    else:
        out["scheduling_strategy"] = "SPREAD"
    return out


def replica_nodes(nodes: list[dict], gpus: float = 0.0, resources: dict | None = None) -> list[str]:
    """The node ids (sorted) of Ray's ``ray.nodes()`` that can hold a sampler replica (``per_node``): alive, with
    ``gpus`` GPUs when its replica asks for them and the custom ``resources`` it is pinned by
    (``cluster.resources.sampler``: :func:`node_resources`)."""
    asked = {"GPU": float(gpus), **{str(k): float(v) for k, v in (resources or {}).items()}}
    return sorted(
        str(n["NodeID"])
        for n in nodes
        if n.get("Alive") and all(float((n.get("Resources") or {}).get(k, 0)) >= v for k, v in asked.items() if v)
    )


def node_resources(cfg, kind: str) -> dict:
    """The Ray options that pin an actor of ``kind`` (``env``, ``learner``, ``sampler``) to the nodes holding the custom
    resources ``cluster.resources.KIND`` names (``{"resources": {...}}``), or ``{}``: anywhere
    (docs/reference/cluster.md, "More than one node")."""
    from omegaconf import DictConfig, OmegaConf

    c = cfg.get("cluster")
    asked = (c.get("resources") or {}).get(kind) if c is not None else None
    if isinstance(asked, DictConfig):
        asked = OmegaConf.to_container(asked, resolve=True)
    return {"resources": {str(k): float(v) for k, v in asked.items()}} if asked else {}
