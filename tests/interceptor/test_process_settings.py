"""What a server sets in its process while it runs, and gives back on exit:
- a gate shortens the interpreter's GIL switch interval (a worker thread rendering a large request then keeps the
  event loop waiting 0.5 ms at most, not Python's 5 ms);
- the heap that exists once it has started is frozen out of the cyclic collector's passes (`gc.freeze`), so a full
  pass walks what rollouts hold instead of the libraries' 200k+ objects."""

from __future__ import annotations

import gc
import sys
import weakref

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


class _Node:
    pass


async def test_the_start_up_heap_is_frozen_while_a_server_runs_and_thawed_after(scripted, tiny_model_dir):
    assert gc.get_freeze_count() == 0
    cycle = _Node()
    cycle.self = cycle  # garbage only the cyclic collector frees
    gone = weakref.ref(cycle)
    config = ServerConfig(upstream=UpstreamConfig(base_url=scripted.url), model_dir=tiny_model_dir)
    async with InterceptionServer(config):
        assert gc.get_freeze_count() > 0
        del cycle
        gc.collect()
        assert gone() is not None  # there before the server started: frozen, so full passes do not walk it
    assert gc.get_freeze_count() == 0
    gc.collect()
    assert gone() is None


async def test_the_heap_stays_frozen_until_the_last_server_of_the_process_stops(scripted, tiny_model_dir):
    config = ServerConfig(upstream=UpstreamConfig(base_url=scripted.url), model_dir=tiny_model_dir)
    async with InterceptionServer(config):
        async with InterceptionServer(ServerConfig(upstream=UpstreamConfig(base_url=scripted.url), mode="black_box")):
            assert gc.get_freeze_count() > 0
        assert gc.get_freeze_count() > 0
    assert gc.get_freeze_count() == 0


async def test_gc_freeze_false_leaves_the_collector_alone(scripted, tiny_model_dir):
    config = ServerConfig(upstream=UpstreamConfig(base_url=scripted.url), model_dir=tiny_model_dir, gc_freeze=False)
    async with InterceptionServer(config):
        assert gc.get_freeze_count() == 0
