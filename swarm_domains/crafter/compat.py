"""Which Crafter this domain runs on: the version it was checked with, and the one-line errors otherwise."""

from __future__ import annotations

from importlib import metadata
from types import ModuleType

#: The Crafter release the domain reads the internals of (``Env._player``, ``Env._sem_view``, ``World``).
SUPPORTED = "1.8.3"
INSTALL = "pip install 'swarm-runtime[crafter]'"


def installed_version() -> str | None:
    """The installed Crafter distribution's version, ``None`` when it is not installed."""
    try:
        return metadata.version("crafter")
    except metadata.PackageNotFoundError:
        return None


def load_crafter() -> ModuleType:
    """Import Crafter, or raise one ``ImportError`` line naming the extra that installs the supported version."""
    version = installed_version()
    if version is None:
        raise ImportError(f"the crafter domain needs Crafter {SUPPORTED}, which is not installed: {INSTALL}")
    if version != SUPPORTED:
        raise ImportError(f"the crafter domain runs on Crafter {SUPPORTED}, found Crafter {version}: {INSTALL}")
    try:
        import crafter
    except ImportError as exc:  # installed but not importable (a broken install, a missing dependency)
        raise ImportError(f"the crafter domain could not import Crafter {version} ({exc}): {INSTALL}") from exc
    return crafter
