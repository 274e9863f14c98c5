"""The run's environment on a joined Ray cluster (``cluster.address``): the actors start with the raylet's
environment, so the variables the project and its domains read there (swarm_runtime/cluster/actor_env.py), the
domain's ``env_vars`` and ``cluster.env_vars`` go to them as the run has them; a secret-named one's value travels
in a setup hook, never in the runtime env Ray shows, and is written nowhere."""

import os
import re
import secrets

import pytest

from swarm_runtime.cluster import actor_env
from tests.conftest import TINY_RUN, swarm


def test_plain_values_go_in_env_vars_and_secret_ones_in_a_setup_hook(monkeypatch):
    monkeypatch.setattr(actor_env, "_EXTRA", ["MY_DOMAIN_API_KEY", "MY_DOMAIN_URL", "UNSET_ONE"])
    environ = {"SWARM_PROMPT_OVERFLOW": "warn", "MY_DOMAIN_API_KEY": "k-123", "MY_DOMAIN_URL": "http://x", "HOME": "/h"}
    env = actor_env.runtime_env(environ)
    assert env["env_vars"] == {"SWARM_PROMPT_OVERFLOW": "warn", "MY_DOMAIN_URL": "http://x"}
    assert "k-123" not in repr(env["env_vars"]) and env["worker_process_setup_hook"].__name__ == "swarm_actor_env"
    assert actor_env.listed(environ) == "SWARM_PROMPT_OVERFLOW, MY_DOMAIN_URL, MY_DOMAIN_API_KEY (secret)"
    monkeypatch.delenv("MY_DOMAIN_API_KEY", raising=False)
    env["worker_process_setup_hook"]()  # what Ray runs in each worker process of the job
    assert os.environ.pop("MY_DOMAIN_API_KEY") == "k-123"
    assert actor_env.runtime_env({"HOME": "/h"}) == {}  # nothing set: ray.init gets no runtime env
    theirs = actor_env.digests(["SWARM_PROMPT_OVERFLOW", "MY_DOMAIN_URL"], {"SWARM_PROMPT_OVERFLOW": "error"})
    assert actor_env.differing(theirs, environ) == ["SWARM_PROMPT_OVERFLOW", "MY_DOMAIN_URL"]
    assert actor_env.differing(actor_env.digests(["MY_DOMAIN_URL"], environ), environ) == []


@pytest.mark.parametrize(
    "value, line",
    [
        ("[NOT_SET_ANYWHERE_X]", "cluster.env_vars: NOT_SET_ANYWHERE_X is not set in this environment"),
        ("[1BAD-NAME]", "cluster.env_vars: '1BAD-NAME' is not an environment variable name"),
        ("MY_KEY", "bad value 'MY_KEY' for 'cluster.env_vars'"),
    ],
)
def test_bad_cluster_env_vars_are_one_line(value, line, tmp_path):
    r = swarm("run", *TINY_RUN, f"cluster.env_vars={value}", f"run_dir={tmp_path / 'run'}", cwd=tmp_path)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert r.stderr.strip().splitlines()[-1].startswith(f"swarm: error: {line}"), r.stderr[-2000:]
    assert not (tmp_path / "run" / "checkpoints").exists()


@pytest.mark.ray
def test_a_joined_cluster_s_actors_get_the_run_s_variables_and_a_secret_is_written_nowhere(ray_head, tmp_path):
    """The shared head (tests/conftest.py ``ray_head``) was started by the test session, whose environment has
    neither variable: the env workers have them only if the run gave them."""
    pytest.importorskip("ray")
    assert "SWARM_PROMPT_OVERFLOW" not in os.environ and "PROBE_API_KEY" not in os.environ
    key = "sk-" + secrets.token_hex(16)
    run = tmp_path / "run"
    env = {**ray_head.env, "SWARM_PROMPT_OVERFLOW": "warn", "PROBE_API_KEY": key}
    r = swarm(
        "run",
        *TINY_RUN,
        "cluster.kind=ray",
        "cluster.env_workers=2",
        *ray_head.args,
        "cluster.env_vars=[PROBE_API_KEY]",
        f"run_dir={run}",
        cwd=tmp_path,
        env=env,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    log = (run / "run.log").read_text()
    # the names the log lists: these two and any other the run has set (.ci/run sets XDG_CACHE_HOME, for one)
    given = re.search(r"the run's variables its actors get: (.*)", log)
    assert given and {"SWARM_PROMPT_OVERFLOW", "PROBE_API_KEY (secret)"} <= set(given[1].split(", ")), log[-3000:]
    have = re.search(r"env workers have the run's (.*)", log)
    assert have and {"SWARM_PROMPT_OVERFLOW", "PROBE_API_KEY"} <= set(have[1].split(", ")), log[-3000:]
    assert "does not have the run's" not in log
    for f in run.rglob("*"):
        if f.is_file():
            assert key.encode() not in f.read_bytes(), f
    assert key not in r.stdout and key not in r.stderr
