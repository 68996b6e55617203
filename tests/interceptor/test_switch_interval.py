"""A gate server shortens the interpreter's GIL switch interval while it runs (a worker thread rendering a large
request then keeps the event loop waiting 0.5 ms at most, not Python's 5 ms), and gives the process's own back."""

from __future__ import annotations

import sys

import pytest

from interceptor import InterceptionServer, ServerConfig, UpstreamConfig
from interceptor.errors import ConfigError


async def test_the_gate_sets_the_switch_interval_while_it_runs_and_restores_it(scripted, tiny_model_dir):
    own = sys.getswitchinterval()
    config = ServerConfig(upstream=UpstreamConfig(base_url=scripted.url), model_dir=tiny_model_dir)
    async with InterceptionServer(config):
        assert sys.getswitchinterval() == pytest.approx(config.gil_switch_interval_s) != own
    assert sys.getswitchinterval() == own


async def test_none_leaves_the_processs_switch_interval_alone(scripted, tiny_model_dir):
    own = sys.getswitchinterval()
    config = ServerConfig(upstream=UpstreamConfig(base_url=scripted.url), model_dir=tiny_model_dir,
                          gil_switch_interval_s=None)
    async with InterceptionServer(config):
        assert sys.getswitchinterval() == own


async def test_a_black_box_server_renders_nothing_and_leaves_it_alone(scripted):
    own = sys.getswitchinterval()
    async with InterceptionServer(ServerConfig(upstream=UpstreamConfig(base_url=scripted.url), mode="black_box")):
        assert sys.getswitchinterval() == own


@pytest.mark.parametrize("value", [0.0, -0.001, 2.0])
def test_a_switch_interval_outside_its_range_is_refused(value, tmp_path):
    with pytest.raises(ConfigError, match="gil_switch_interval_s"):
        ServerConfig(upstream=UpstreamConfig(base_url="http://127.0.0.1:9"), model_dir=tmp_path,
                     gil_switch_interval_s=value)
