"""``swarm domains`` and ``swarm plugins``: what is installed (each domain's roles and tasks; each plugin's
registrations and hooks)."""

from __future__ import annotations

from swarm_runtime.cli.common import plugin_registry


def cmd_domains(args) -> int:
    """``swarm domains``: each domain with its roles and tasks."""
    _, reg = plugin_registry()
    for name, d in sorted(reg.domains.items()):
        print(f"{name}: {d.description}".rstrip(": "))
        print(f"  roles: {', '.join(r.name for r in d.roles)}")
        print(f"  tasks: {', '.join(d.task_names())}")
    return 0


def cmd_plugins(args) -> int:
    """``swarm plugins``: each loaded plugin, what it registered and the hooks it implements."""
    pm, reg = plugin_registry()
    for name, items in reg.provenance.items():
        print(f"{name}")
        for it in items:
            print(f"  {it}")
        hooks = sorted(h.name for h in pm.get_hookcallers(pm.get_plugin(name)) or [])
        print(f"  hooks: {', '.join(hooks) or '(none)'}")
    return 0
