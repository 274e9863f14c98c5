"""Joining a Ray head on this machine by a loopback address (``cluster.address=127.0.0.1:PORT``,
swarm_runtime/cluster/ray_helpers.py: ``_probe``, ``_keep_loopback``). Ray 2.60 with clusters on (Linux's default) dials
the machine's routable address instead of 127.0.0.1; a head started on loopback only (as this project starts its
Rays) does not answer there and ``ray.init`` retried for 10 min without a word (measured by hand: docs/reference/cluster.md,
"Loopback"). Now: where the routable address does not answer, clusters are turned off before Ray is imported (Ray
keeps 127.0.0.1); where the user turned them on, one line says why instead. No Ray is started here: the heads are
plain TCP listeners, all on loopback (127.0.0.2 stands in for the routable address)."""

import socket
import sys

import pytest

from swarm_runtime.cluster import ray_helpers as remote
from swarm_runtime.config.errors import ConfigError


def _listen(host: str, port: int = 0) -> socket.socket:
    s = socket.socket()
    s.bind((host, port))
    s.listen()
    return s


@pytest.fixture
def fresh(monkeypatch):
    """As before Ray's first import in a ``swarm`` process: no Ray module, no clusters setting, and this machine's
    routable address played by 127.0.0.2."""
    monkeypatch.delitem(sys.modules, "ray", raising=False)
    monkeypatch.delenv(remote.LOCAL_ONLY, raising=False)
    monkeypatch.setattr(remote, "routable_ip", lambda: "127.0.0.2")
    return monkeypatch


def test_a_head_on_loopback_only_turns_rays_clusters_off_before_its_import(fresh):
    import os

    with _listen("127.0.0.1") as head:
        port = head.getsockname()[1]
        remote._probe("cluster.address", f"127.0.0.1:{port}")
        assert os.environ[remote.LOCAL_ONLY] == "0" and "ray" not in sys.modules


def test_a_head_on_every_interface_leaves_rays_choice_alone(fresh):
    import os

    with _listen("127.0.0.1") as head:
        port = head.getsockname()[1]
        with _listen("127.0.0.2", port):  # the head answers on the "routable" address too
            remote._probe("cluster.address", f"127.0.0.1:{port}")
        assert remote.LOCAL_ONLY not in os.environ


def test_clusters_turned_on_by_the_user_and_a_loopback_head_is_one_line(fresh):
    fresh.setenv(remote.LOCAL_ONLY, "1")
    with _listen("127.0.0.1") as head:
        port = head.getsockname()[1]
        with pytest.raises(ConfigError) as e:
            remote._probe("serve.address", f"127.0.0.1:{port}")
    msg = str(e.value)
    assert msg.startswith(f"serve.address='127.0.0.1:{port}': the head there listens on loopback only")
    assert f"127.0.0.2:{port}" in msg and "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0" in msg


def test_nothing_listening_is_still_the_unreachable_line(fresh):
    with _listen("127.0.0.1") as s:
        port = s.getsockname()[1]
    with pytest.raises(ConfigError, match=rf"cluster.address='127.0.0.1:{port}': no Ray cluster answers there"):
        remote._probe("cluster.address", f"127.0.0.1:{port}")
