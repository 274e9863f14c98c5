"""Bad values at the edges of the command line, through the real ``swarm`` CLI: a section given a value
(``cluster=ray``), a run folder named with control characters, ``swarm export out=`` an existing file. Each case is
one exit-2 line naming the key and what to give instead, and nothing is written. Cheap: config resolution only
(about a second each through the warm CLI)."""

from __future__ import annotations

import pytest
import yaml
from conftest import swarm

#: A config section given a value, and what the one line must say: the key that takes the value where one does.
SECTIONS = [
    (["cluster=ray"], "cluster=ray is not valid: cluster is a section, not a value; did you mean cluster.kind=ray?"),
    (["rollout=vllm"], "did you mean rollout.engine=vllm?"),
    (["train=fsdp"], "did you mean train.engine=fsdp?"),
    (["eval=x"], "eval is a section, not a value; set its keys, eval.KEY=VALUE; keys of eval: runs"),
    (["serve=on"], "serve is a section, not a value; set its keys, serve.KEY=VALUE"),
    (["experiment=3"], "experiment is a section, not a value"),
    (["rlcr=1"], "rlcr is a section, not a value"),
    (["cluster=null"], "cluster is a section, not a value"),
    (
        ["model.lora=8"],
        "model.lora is a section, not a value; set its keys, model.lora.KEY=VALUE; keys of model.lora: rank",
    ),
    (["algo.sft=no"], "algo.sft is a section, not a value"),
    (["rollout.vllm=x"], "rollout.vllm is a section, not a value"),
    (["rlcr.t_max=5"], "rlcr.t_max is a section, not a value"),
    (["model.bases=x"], "model.bases is a mapping; give its entries (model.bases.NAME=VALUE)"),
    (["model.arch=x"], "model.arch is a mapping"),
    (["cluster.resources=3"], "cluster.resources is a mapping"),
    (
        ["task.eval_seeds=5"],
        "task.eval_seeds is a section (keys: start, count); set its keys, task.eval_seeds.KEY=VALUE",
    ),
    (["task.minestudio=[1]"], "task.minestudio is a section (keys: frames"),
]


@pytest.mark.parametrize("args, needle", SECTIONS, ids=[a[0] for a, _ in SECTIONS])
def test_a_section_given_a_value_is_one_line_naming_the_key_to_set(tmp_path, args, needle, warm_swarm):
    res = warm_swarm("config", *args, cwd=tmp_path, timeout=120)
    assert res.returncode == 2, (res.stdout, res.stderr)
    assert needle in res.stderr, res.stderr
    assert "Invalid type assigned" not in res.stderr and "Cannot assign" not in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1, res.stderr


def test_swarm_run_cluster_ray_names_cluster_kind_before_anything_is_written(tmp_path):
    res = swarm("run", "cluster=ray", cwd=tmp_path, timeout=120)  # cold: the precheck, before the plugins load
    assert res.returncode == 2, (res.stdout, res.stderr)
    assert "did you mean cluster.kind=ray?" in res.stderr
    assert not (tmp_path / "runs").exists()


def test_a_section_still_takes_null_where_the_task_allows_it_and_its_keys_as_before(tmp_path, warm_swarm):
    res = warm_swarm("config", "domain=openresearcher", "task.dev_seeds=null", "cluster.kind=ray", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert "dev_seeds: null" in res.stdout and "kind: ray" in res.stdout


def test_none_is_the_word_for_a_string_setting_that_has_it_and_null_for_an_optional_one(tmp_path, warm_swarm):
    """``model.chat_template=none`` and ``cluster.placement=none`` (documented values) are the word ``none``, not
    YAML's null (which those settings refuse); an optional setting (``model.adapter``) still takes null."""
    args = ("model.chat_template=none", "cluster.placement=NONE", "model.adapter=none")
    res = warm_swarm("config", "domain=minecraft", "task=wooden_pickaxe", *args, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    cfg = yaml.safe_load(res.stdout)
    assert cfg["model"]["chat_template"] == "none" and cfg["cluster"]["placement"] == "none"
    assert cfg["model"]["adapter"] is None


@pytest.mark.parametrize("name", ["a\nb", "a\tb", "a\x01b", "a\rb"], ids=["newline", "tab", "soh", "cr"])
def test_a_run_dir_with_control_characters_is_refused_not_rewritten(tmp_path, name, warm_swarm):
    res = warm_swarm("run", f"run_dir={tmp_path / name}", "algo.iterations=0", cwd=tmp_path, timeout=120)
    assert res.returncode == 2, (res.stdout, res.stderr)
    assert f"run_dir={str(tmp_path / name)!r} is not valid: must be a non-empty path without control characters" in (
        res.stderr
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # neither 'a b' nor anything else


def test_a_run_dir_with_a_space_is_still_a_folder_name(tmp_path, warm_swarm):
    res = warm_swarm("config", f"run_dir={tmp_path / 'a b'}", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    # the printed YAML may fold a long value at its space: read it back
    assert yaml.safe_load(res.stdout)["run_dir"] == str(tmp_path / "a b")


def test_export_into_an_existing_file_names_the_out_path_not_the_checkpoint(tiny_run, tmp_path, warm_swarm):
    run, _ = tiny_run  # read only: out= is outside it
    taken = tmp_path / "taken.txt"
    taken.write_text("keep me")
    for out, what in ((taken, "is a file, not a folder"), (taken / "sub", f"is inside {str(taken)!r}, a file")):
        res = warm_swarm("export", str(run), f"out={out}", cwd=tmp_path, timeout=120)
        assert res.returncode == 2, (res.stdout, res.stderr)
        assert f"out={str(out)!r} {what}" in res.stderr and "cannot be loaded" not in res.stderr, res.stderr
        assert len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert taken.read_text() == "keep me"
