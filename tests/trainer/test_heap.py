"""`retained_heap` keeps the pages of freed memory for the next step inside it, and gives them back when it ends.
Each case runs in a fresh interpreter: glibc's malloc settings are process-wide and adapt to what a process freed
before."""

from __future__ import annotations

import json
import platform
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="retained_heap changes glibc's malloc only")

# Steps as a training loop has them: allocate a few tens of MB in blocks of 16 MB, touch every page, free it all.
_STEPS = """
import ctypes, json, os, resource, sys
from trainer.models.heap import retained_heap

libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = (ctypes.c_size_t,)
libc.free.argtypes = (ctypes.c_void_p,)
BLOCK, BLOCKS = 16 << 20, 6

def step():
    blocks = [libc.malloc(BLOCK) for _ in range(BLOCKS)]
    for block in blocks:
        ctypes.memset(block, 1, BLOCK)
    for block in blocks:
        libc.free(block)

def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt

def resident():
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

def steps():
    step()  # the first step faults its pages in, in any case
    before = faults()
    for _ in range(4):
        step()
    return faults() - before

if sys.argv[1] == "retained":
    with retained_heap() as took:
        later = steps()
        inside = resident()
    after = resident()
    print(json.dumps({"took": took, "faults": later, "freed_on_exit": inside - after}))
else:
    print(json.dumps({"faults": steps()}))
"""


def _run(case: str) -> dict:
    done = subprocess.run([sys.executable, "-c", _STEPS, case], capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


def test_steps_inside_reuse_their_pages_where_glibc_defaults_fault_them_in_again():
    default = _run("default")
    retained = _run("retained")
    assert retained["took"] is True
    # by default the heap's free top goes back to the system after every step: four steps of 96 MB fault again
    assert default["faults"] > 0, default
    assert retained["faults"] < default["faults"] // 8, (retained, default)


def test_the_free_heap_is_given_back_when_the_block_ends():
    retained = _run("retained")
    assert retained["freed_on_exit"] >= 48 << 20, retained
