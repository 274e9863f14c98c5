"""Recipes: shipped configs for a model and a machine (``recipe=NAME`` or ``recipe=PATH``), which ``swarm run``,
``swarm config`` and ``swarm experiment`` expand into ``key=value`` arguments before the rest of the command line."""

from __future__ import annotations

from pathlib import Path

from swarm_runtime.config.errors import ConfigError
from swarm_runtime.config.load import RUN_CONTROL


def recipe_names() -> list[str]:
    """The shipped recipes' names (``recipe=NAME``)."""
    from importlib.resources import files

    return sorted(f.name[:-5] for f in files("swarm_runtime").joinpath("recipes").iterdir() if f.name.endswith(".yaml"))


def find_recipe(given: str):
    """``recipe=``'s file: a path to a YAML file, or the name of a shipped recipe (``NAME``,
    ``NAME.yaml`` or ``configs/NAME.yaml``, found in the installed package through importlib.resources,
    so it works from a wheel as from a checkout)."""
    from importlib.resources import files

    path = Path(given)
    if path.is_file():
        return path
    name = path.name[:-5] if path.name.endswith(".yaml") else path.name
    if path.parent in (Path("."), Path("configs")):
        shipped = files("swarm_runtime").joinpath("recipes", f"{name}.yaml")
        if shipped.is_file():
            return shipped
    raise ConfigError(
        f"recipe {given!r} is neither a file nor a shipped recipe; shipped recipes: "
        f"{', '.join(recipe_names()) or '(none)'}"
    )


def expand_recipe(overrides: list[str]) -> list[str]:
    """``recipe=NAME`` (a shipped recipe) or ``recipe=PATH`` -> the recipe's ``key: value`` lines as
    ``key=value`` arguments, placed before the rest of the command line (which wins). A recipe is a
    flat YAML mapping of config groups (``domain``, ``task``, ``model``, ``algo``, ``hardware``) and
    dotted keys (``configs/*.yaml``, shipped as ``swarm_runtime/recipes/``)."""
    import yaml

    out, recipes = [], [o for o in overrides if o.startswith("recipe=")]
    if len(recipes) > 1:
        raise ConfigError(f"give one recipe=, got {len(recipes)}")
    for item in recipes:
        given = item.partition("=")[2]
        try:
            data = yaml.safe_load(find_recipe(given).read_text()) or {}
        except (yaml.YAMLError, UnicodeDecodeError) as exc:
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:120]
            raise ConfigError(
                f"recipe {given!r} is not YAML ({first}); a recipe is a YAML mapping of key: value (configs/*.yaml)"
            ) from exc
        if not isinstance(data, dict):
            raise ConfigError(f"recipe {given!r} must be a mapping of key: value")
        control = [str(k) for k in data if str(k) in RUN_CONTROL]
        if control:
            raise ConfigError(
                f"recipe {given!r} sets {control[0]}: {', '.join(RUN_CONTROL)} pick and operate a run "
                f"folder and come from the command line only; remove {control[0]} from the recipe"
            )
        if Path(given).is_file():  # a file from elsewhere (a shipped recipe is the package's own)
            refuse_recipe_choices(given, data, [o for o in overrides if not o.startswith("recipe=")])
        for k, v in data.items():
            if isinstance(v, (dict, list)):
                v = yaml.safe_dump(v, default_flow_style=True).strip()
            out.append(f"{k}={'null' if v is None else v}")
    return out + [o for o in overrides if not o.startswith("recipe=")]


def refuse_recipe_choices(given: str, data: dict, rest: list[str]) -> None:
    """A recipe file (``recipe=PATH``) that names a program, server flags, a server
    (``secrets.CHOSEN_ON_THE_COMMAND_LINE``: ``rollout.vllm.python``, ``rollout.vllm.args``, ``rollout.url``,
    ``rollout.urls``, ``task.llm_judge.base_url``) or a Ray head (``secrets.RAY_HEAD_KEYS``: ``cluster.address``,
    ``serve.address``) is refused unless ``rest`` (the command line) gives the key too: the rule a run folder's saved
    config follows."""
    from omegaconf import OmegaConf

    from swarm_runtime.config.schema import GROUPS, RunConfig
    from swarm_runtime.config.secrets import RAY_HEAD_KEYS, gives, recipe_choices, shown_value

    top = {str(k) for k in OmegaConf.structured(RunConfig).keys()} | set(GROUPS)
    keys = [k if k.split(".", 1)[0] in top else f"task.{k}" for k in (a.partition("=")[0] for a in rest if "=" in a)]
    for key, value in recipe_choices(data, top):
        if not gives(key, keys):
            local = f", or {key}=null for a local Ray" if key in RAY_HEAD_KEYS else ""
            raise ConfigError(
                f"recipe {given!r} sets {key}={shown_value(value)!r}: swarm does not run a program, pass server flags, "
                f"join a Ray cluster or send the run's prompts and keys where a file says; give {key}=... on the "
                f"command line if you trust it{local}"
            )
