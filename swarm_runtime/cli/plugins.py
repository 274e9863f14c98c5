"""``swarm domains`` and ``swarm plugins``: what is installed."""

from __future__ import annotations

from swarm_runtime.cli.common import _registry


def cmd_domains(args) -> int:
    _, reg = _registry()
    for name, d in sorted(reg.domains.items()):
        print(f"{name}: {d.description}".rstrip(": "))
        print(f"  roles: {', '.join(r.name for r in d.roles)}")
        print(f"  tasks: {', '.join(d.task_names())}")
    return 0


def cmd_plugins(args) -> int:
    pm, reg = _registry()
    for name, items in reg.provenance.items():
        print(f"{name}")
        for it in items:
            print(f"  {it}")
        hooks = sorted(h.name for h in pm.get_hookcallers(pm.get_plugin(name)) or [])
        print(f"  hooks: {', '.join(hooks) or '(none)'}")
    return 0
