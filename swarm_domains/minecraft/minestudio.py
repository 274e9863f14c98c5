"""Real backend (``sim=minestudio``): MineStudio's ``MinecraftSim`` driven by a frozen STEVE-1.

Each instruction becomes a STEVE-1 text condition executed for ``frames`` (40)
frames; milestone rewards come from MineStudio's ``RewardsCallback``
(``pickup`` / ``craft_item`` events, each paid once). Crafting through the GUI
is weak in STEVE-1, so ``craft_via: commands`` (optional) performs ``craft *`` /
``smelt *`` with ``/clear`` + ``/give`` after checking the real recipe against
the real inventory. Minecraft has no world save, so ``restore`` = reseed +
replay of the instruction prefix (only the missing suffix when the snapshot
extends the current history). Replays re-sample STEVE-1 with the same torch
seed per instruction, but Minecraft itself is not bit-exact: a replayed world
may drift, so the adapter trusts the snapshot's bookkeeping (milestones paid,
last outcome) over the replayed inventory.

Needs ``pip install 'swarm-runtime[minestudio]'``, a CUDA GPU, Java 8 (JDK) and
the MineStudio engine (downloaded by MineStudio on first use).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from loguru import logger

from swarm_domains.minecraft import expert
from swarm_domains.minecraft.instructions import OWNER, parse
from swarm_domains.minecraft.recipes import FUELS, GATHERS, ITEMS, RECIPES
from swarm_domains.minecraft.task import TaskSpec
from swarm_domains.minecraft.world import missing_for
from swarm_runtime.core.env import DomainEnv, ExpertStep, StepResult

INSTALL_HINT = (
    "the minestudio backend needs the 'minestudio' package: pip install 'swarm-runtime[minestudio]'; "
    "it also needs a CUDA GPU, Java 8 (JDK) and MineStudio's simulator engine"
)

#: Backend settings (override under ``minestudio:`` in the task YAML).
DEFAULTS: Mapping[str, Any] = {
    "model": "CraftJarvis/MineStudio_STEVE-1.official",
    "frames": 40,
    "cond_scale": 4.0,
    "device": "cuda",
    "obs_size": (128, 128),
    "craft_via": "steve",  # or "commands"
}
CRAFT_MODES = ("steve", "commands")

#: STEVE-1 text prompt of each instruction (short, goal-oriented, MineCLIP-style).
PROMPTS: Mapping[str, str] = {
    "chop tree": "chop a tree",
    "explore": "explore",
    "mine stone": "mine stone",
    "mine coal": "mine coal",
    "mine iron": "mine iron ore",
    "dig down": "dig down",
    "climb up": "climb up and get out of the hole",
    **{r.instruction: f"{r.verb} {r.output.replace('_', ' ')}" for r in RECIPES.values()},
}

_WOODS = ("oak", "birch", "spruce", "jungle", "acacia", "dark_oak")
#: Minecraft item ids that count as each domain item.
MC_IDS: Mapping[str, tuple[str, ...]] = {
    **{i: (i,) for i in ITEMS},
    "log": tuple(f"{w}_log" for w in _WOODS),
    "planks": tuple(f"{w}_planks" for w in _WOODS),
    "stone_bricks": ("stone_bricks",),
}


_CRAFTS = frozenset(r.instruction for r in RECIPES.values())


def reward_config(milestones: Mapping[str, float]) -> list[dict]:
    """``RewardsCallback`` config: gathered items pay on ``pickup``, made ones on ``craft_item``
    (Minecraft's crafted statistic also counts smelted items), each at most once."""
    return [
        {
            "event": "pickup" if item in GATHERS else "craft_item",
            "identity": item,
            "objects": list(MC_IDS[item]),
            "reward": float(r),
            "max_reward_times": 1,
        }
        for item, r in milestones.items()
    ]


def mc_inventory(info: Mapping[str, Any]) -> Counter:
    """Minecraft id -> count from ``info['inventory']`` (slot -> {type, quantity})."""
    out: Counter = Counter()
    for slot in (info.get("inventory") or {}).values():
        kind, qty = str(slot.get("type", "none")).removeprefix("minecraft:"), int(slot.get("quantity", 0))
        if kind not in ("none", "air") and qty > 0:
            out[kind] += qty
    return out


def domain_inventory(mc_inv: Mapping[str, int]) -> dict[str, int]:
    """Domain item -> count (all wood types pooled)."""
    inv = {item: sum(mc_inv.get(i, 0) for i in ids) for item, ids in MC_IDS.items()}
    return {k: v for k, v in inv.items() if v > 0}


def craft_commands(item: str, mc_inv: Mapping[str, int]) -> list[str] | None:
    """Chat commands that make one batch of ``item`` from ``mc_inv`` (``None`` when the
    real recipe cannot be made: missing ingredient, station or fuel)."""
    inv = domain_inventory(mc_inv)
    if missing_for(item, inv):
        return None
    rec = RECIPES[item]
    consume = dict(rec.inputs)
    if rec.needs_fuel:
        fuel = next(f for f in FUELS if inv.get(f, 0) - rec.inputs.get(f, 0) > 0)
        consume[fuel] = consume.get(fuel, 0) + 1
    cmds, left = [], Counter(mc_inv)
    for ing, n in consume.items():
        for mc_id in MC_IDS[ing]:
            k = min(n, left[mc_id])
            if k:
                cmds.append(f"/clear @p minecraft:{mc_id} {k}")
                left[mc_id] -= k
                n -= k
    out_id = "oak_planks" if item == "planks" else MC_IDS[item][0]
    return cmds + [f"/give @p minecraft:{out_id} {rec.count}"]


def replay_plan(current: Sequence[str], target: Sequence[str]) -> tuple[bool, list[str]]:
    """How to bring a world whose instruction history is ``current`` to ``target``:
    ``(reset_first, instructions_to_replay)``. Minecraft cannot go back, so anything
    but an extension of ``current`` needs a reseed and a full replay."""
    if len(target) >= len(current) and list(target[: len(current)]) == list(current):
        return False, list(target[len(current) :])
    return True, list(target)


class _Runtime:
    """The live simulator and the frozen STEVE-1 (never copied into snapshots)."""

    def __init__(self, cfg: Mapping[str, Any], milestones: Mapping[str, float]):
        try:
            import torch
            from minestudio.models import SteveOnePolicy
            from minestudio.simulator import MinecraftSim
            from minestudio.simulator.callbacks import RewardsCallback
        except ImportError as exc:
            raise ImportError(f"{INSTALL_HINT} ({exc})") from exc
        self.torch, self.sim_cls, self.rewards_cls = torch, MinecraftSim, RewardsCallback
        self.cfg, self.milestones = cfg, milestones
        logger.info("loading STEVE-1 {} on {}", cfg["model"], cfg["device"])
        self.policy = SteveOnePolicy.from_pretrained(cfg["model"]).to(cfg["device"]).eval()
        self.sim, self.seed, self.rewards = None, None, None
        self.obs: dict = {}
        self.info: dict = {}

    def reset(self, seed: int) -> None:
        if self.sim is None or self.seed != seed:  # the world seed is fixed at construction
            if self.sim is not None:
                self.sim.close()
            self.rewards = self.rewards_cls(reward_config(self.milestones))
            self.sim = self.sim_cls(
                action_type="agent", seed=seed, obs_size=tuple(self.cfg["obs_size"]), callbacks=[self.rewards]
            )
            self.seed = seed
        self.obs, self.info = self.sim.reset()

    def run(self, instruction: str, torch_seed: int, craft_via: str) -> float:
        """Execute one instruction; the milestone reward the callback paid."""
        if craft_via == "commands" and instruction in _CRAFTS:
            return self._craft_by_commands(instruction)
        self.torch.manual_seed(torch_seed)
        cond = {"cond_scale": float(self.cfg["cond_scale"]), "text": PROMPTS[instruction]}
        memory, reward = None, 0.0
        with self.torch.inference_mode():
            for _ in range(int(self.cfg["frames"])):
                action, memory = self.policy.get_action(
                    {"image": self.obs["image"], "condition": cond}, memory, input_shape="*"
                )
                self.obs, r, terminated, truncated, self.info = self.sim.step(action)
                reward += float(r)
                if terminated or truncated:
                    break
        return reward

    def _craft_by_commands(self, instruction: str) -> float:
        item = next(o for o, r in RECIPES.items() if r.instruction == instruction)
        cmds = craft_commands(item, mc_inventory(self.info))
        for cmd in cmds or ():
            obs, _, _, info = self.sim.env.execute_cmd(cmd)
            self.obs, self.info = self.sim._wrap_obs_info(obs, info)
        paid = self.rewards.reward_memory
        if cmds and item in self.milestones and not paid.get(item):  # /give bypasses the craft statistic
            paid[item] = 1
            return float(self.milestones[item])
        return 0.0


class MineStudioEnv(DomainEnv):
    """The minecraft domain on real Minecraft. Snapshots are plain bookkeeping
    (seed + instruction history); the simulator is rebuilt by replay."""

    def __init__(self, spec: TaskSpec):
        self.spec = spec
        self.cfg = {**DEFAULTS, **dict(spec.backend)}
        unknown = sorted(set(self.cfg) - set(DEFAULTS))
        if unknown:
            raise ValueError(f"unknown minestudio settings {unknown}; valid: {', '.join(DEFAULTS)}")
        if self.cfg["craft_via"] not in CRAFT_MODES:
            raise ValueError(
                f"minestudio.craft_via {self.cfg['craft_via']!r} is unknown; valid: {', '.join(CRAFT_MODES)}"
            )
        self._rt: _Runtime | None = None
        self.state: dict[str, Any] = self._blank(0)
        self._live_history: list[str] = []  #: what the simulator has actually executed since its reset

    @staticmethod
    def _blank(seed: int) -> dict[str, Any]:
        return {"seed": seed, "history": [], "obtained": [], "last": "none", "steps": 0, "done": False}

    def _runtime(self) -> _Runtime:
        if self._rt is None:
            self._rt = _Runtime(self.cfg, self.spec.milestones)
        return self._rt

    # ---- episode ----------------------------------------------------------------
    def reset(self, seed: int) -> str:
        self.state = self._blank(int(seed))
        self._runtime().reset(int(seed))
        self._live_history = []
        return self.observation()

    def step(self, action: str, role: str | None = None) -> StepResult:
        st = self.state
        st["steps"] += 1
        instr = parse(action)
        if instr is None or st["done"]:
            return StepResult(self.observation(), 0.0, st["done"], valid=False)
        before = dict(self._inventory())
        self._runtime().run(instr, st["seed"] * 1000 + len(st["history"]), self.cfg["craft_via"])
        st["history"].append(instr)
        self._live_history.append(instr)
        new = [
            m for m in self.spec.milestones if self._runtime().rewards.reward_memory.get(m) and m not in st["obtained"]
        ]
        st["obtained"] += new
        reward = sum(self.spec.milestones[m] for m in new)
        st["last"] = f"{instr} {'ok' if new or self._inventory() != before else 'failed'}"
        st["done"] = self.spec.target in st["obtained"]
        return StepResult(self.observation(), float(reward), st["done"], True, {"instruction": instr})

    def _inventory(self) -> dict[str, int]:
        return domain_inventory(mc_inventory(self._rt.info if self._rt else {}))

    def observation(self) -> str:
        inv = self._inventory()
        items = " ".join(f"{i} {inv[i]}" for i in ITEMS if inv.get(i)) or "empty"
        return f"goal {self.spec.target} . inventory {items} . last {self.state['last']}"

    # ---- snapshot = bookkeeping; restore = reseed + replay ----------------------------
    def snapshot(self) -> dict[str, Any]:
        return {**self.state, "history": list(self.state["history"]), "obtained": list(self.state["obtained"])}

    def restore(self, snapshot: dict[str, Any]) -> None:
        target = list(snapshot["history"])
        reset, todo = replay_plan(self._live_history, target)
        if snapshot["seed"] != self.state["seed"]:
            reset, todo = True, target
        rt = self._runtime()
        if reset:
            rt.reset(snapshot["seed"])
            self._live_history = []
        logger.debug("minestudio restore: reset={} replay {} instructions", reset, len(todo))
        for instr in todo:
            rt.run(instr, snapshot["seed"] * 1000 + len(self._live_history), self.cfg["craft_via"])
            self._live_history.append(instr)
        self.state = {**snapshot, "history": target, "obtained": list(snapshot["obtained"])}

    def expert_action(self) -> ExpertStep | None:
        if self.state["done"]:
            return None
        instr = expert.scripted_instruction(self.spec.target, self._inventory(), 0)
        return None if instr is None else ExpertStep(OWNER[instr], instr)

    def metrics(self) -> dict[str, float]:
        got = self.state["obtained"]
        out = {"success": float(self.spec.target in got), "steps": float(self.state["steps"])}
        out.update({f"has_{m}": float(m in got) for m in self.spec.milestones})
        return out

    def close(self) -> None:
        """Close the simulator and drop the runtime (its STEVE-1 weights); a second call does nothing."""
        rt, self._rt = self._rt, None
        if rt is not None and rt.sim is not None:
            sim, rt.sim = rt.sim, None
            sim.close()
