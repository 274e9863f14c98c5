"""``run.RunFolder``: the run folder object ``prepare_run`` starts a run in (fresh, overwrite, resume), in
process; the command-line paths are in tests/test_cli.py, tests/test_trust.py and tests/test_resume_overrides.py."""

from __future__ import annotations

import pytest

from swarm_runtime.config.errors import ConfigError
from swarm_runtime.config.load import resolve
from swarm_runtime.runs import runfiles
from swarm_runtime.runs.folder import RunFolder


def _cfg(registry, *args):
    return resolve(["domain=minecraft", "task=wooden_pickaxe", *args], registry[1])


def test_the_folder_knows_how_the_run_starts(registry, tmp_path):
    where = f"run_dir={tmp_path / 'r'}"
    assert RunFolder.pick(_cfg(registry, where)).mode == "fresh"
    assert RunFolder.pick(_cfg(registry, where, "overwrite=true")).mode == "overwrite"
    folder = RunFolder.pick(_cfg(registry, where, "resume=true"), command="experiment")
    assert (folder.mode, folder.command, folder.path) == ("resume", "experiment", tmp_path / "r")


def test_a_resume_of_no_folder_creates_nothing(registry, tmp_path):
    folder = RunFolder.pick(_cfg(registry, f"run_dir={tmp_path / 'gone'}", "resume=true"))
    with pytest.raises(ConfigError, match="does not exist"):
        folder.create()
    assert not (tmp_path / "gone").exists()


def test_a_fresh_start_keeps_a_run_it_finds_and_overwrite_replaces_it(registry, tmp_path):
    run = tmp_path / "r"
    fresh = RunFolder.pick(_cfg(registry, f"run_dir={run}"))
    fresh.create()
    cfg = fresh.start(_cfg(registry, f"run_dir={run}"), registry[1])
    fresh.save_config(cfg)
    runfiles.claim(run / "checkpoints").mkdir()  # as the trainer writes it: listed in the folder's manifest
    again = RunFolder.pick(_cfg(registry, f"run_dir={run}"))
    with pytest.raises(ConfigError, match="already holds a run"):
        again.start(_cfg(registry, f"run_dir={run}"), registry[1])
    assert (run / "config.yaml").exists() and (run / "checkpoints").is_dir()  # nothing lost
    over = RunFolder.pick(_cfg(registry, f"run_dir={run}", "overwrite=true"))
    over.start(_cfg(registry, f"run_dir={run}", "overwrite=true"), registry[1])
    assert not (run / "config.yaml").exists() and not (run / "checkpoints").exists()
    (run / "notes.txt").write_text("mine")  # a file swarm did not write: overwrite refuses, deleting nothing
    over.save_config(_cfg(registry, f"run_dir={run}"))
    with pytest.raises(ConfigError, match="notes.txt"):
        RunFolder.pick(_cfg(registry, f"run_dir={run}", "overwrite=true")).start(
            _cfg(registry, f"run_dir={run}", "overwrite=true"), registry[1]
        )
    assert (run / "notes.txt").read_text() == "mine" and (run / "config.yaml").exists()


def test_the_folders_actors_write_are_the_runs_own(tmp_path):
    """``learners/`` (learner actors' pid files, cluster.learners=ray) and ``engine/`` (the engine server's base,
    adapters and log) are in the manifest, so ``overwrite=true`` of such a run deletes them instead of refusing the
    folder as holding files swarm did not write (it did, before they were claimed)."""
    from swarm_runtime.cluster.learners import pid_files
    from swarm_runtime.sampling.factory import engine_folder

    run = tmp_path / "run"
    run.mkdir()
    runfiles.start(run)
    files = pid_files(run, ["Logger", "base-default"])
    assert files == {n: str(run / "learners" / f"{n}.pid") for n in ("Logger", "base-default")}
    (run / "learners").mkdir()
    for f in files.values():
        open(f, "w").write("1\n")
    engine_folder(run, "other").mkdir(parents=True)
    assert runfiles.foreign(run) == []
    assert {"learners", "engine"} <= runfiles.owned(run)
    assert pid_files(None, ["Logger"]) == {"Logger": None}
