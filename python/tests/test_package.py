"""The `ferrocx` package without torch: what `ferrocx info` shows, a communicator of one rank
from the environment, its collectives on raw addresses, and its errors."""

import os
import subprocess
import sys

import pytest

import ferrocx


def test_info_shows_the_local_configuration_and_the_built_in_adaptors():
    info = ferrocx.info()
    assert info["config"] == "<built-in defaults>", info
    assert [c["name"] for c in info["clusters"]] == ["local"], info
    assert info["clusters"][0]["device"] == "host" and info["clusters"][0]["selected"], info
    names = {a["name"]: a for a in info["adaptors"]}
    assert {"host", "cuda", "nccl"} <= set(names), names
    assert names["host"]["source"] == "built-in"
    assert "ferrocx_device_adaptor_v1" in names["host"]["groups"]


def test_info_names_a_bad_configuration(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('[[cluster]]\nname = "x"\ndevice = "nope"\nccl = "host"\n')
    info = ferrocx.info(str(bad))
    c = info["clusters"][0]
    assert c["selected"] is False and "nope" in c["error"], c
    bad.write_text("[[cluster]\n")
    with pytest.raises(ferrocx.Error, match="bad.toml"):
        ferrocx.info(str(bad))


CHILD = r"""
import ctypes, random, struct, sys
import ferrocx
c = ferrocx.Communicator.from_env()
assert (c.rank, c.world, c.cluster, c.device, c.ccl) == (0, 1, "local", "host", "host"), repr(c)
for n in (1, 7, 1000):
    vals = [random.uniform(-9, 9) for _ in range(n)]
    src = (ctypes.c_double * n)(*vals)
    dst = (ctypes.c_double * n)()
    c.all_reduce(ctypes.addressof(src), ctypes.addressof(dst), n, ferrocx.F64, ferrocx.SUM)
    c.synchronize()
    assert list(dst) == vals, n
    out = (ctypes.c_double * n)()
    c.all_gather(ctypes.addressof(src), ctypes.addressof(out), n, ferrocx.F64)
    c.broadcast(ctypes.addressof(src), ctypes.addressof(out), n, ferrocx.F64, 0)
    c.synchronize()
    assert list(out) == vals, n
# One stream ordered after another (here the communicator's own, the one host stream there
# is) through the communicator's events, many times: events are taken again once recorded.
vals = [random.uniform(-9, 9) for _ in range(33)]
src = (ctypes.c_double * 33)(*vals)
dst = (ctypes.c_double * 33)()
for _ in range(50):
    c.order(c.stream, c.stream)
c.all_reduce(ctypes.addressof(src), ctypes.addressof(dst), 33, ferrocx.F64, ferrocx.MAX)
c.order(c.stream, c.stream)
c.synchronize()
assert list(dst) == vals
try:
    c.order(12345, c.stream)
except ferrocx.Error as e:
    print("order error:", e)
else:
    raise AssertionError("no error for a stream that is not one")
try:
    c.all_reduce(0, 0, 4, 999, ferrocx.SUM)
except ferrocx.Error as e:
    assert "dtype" in str(e), e
else:
    raise AssertionError("no error for an unknown dtype")
try:
    c.broadcast(ctypes.addressof(src), ctypes.addressof(out), 1, ferrocx.F64, 5)
    c.synchronize()
except ferrocx.Error as e:
    print("root error:", e)
else:
    raise AssertionError("no error for root 5 of 1")
print("world one ok")
"""


def test_a_communicator_of_one_rank_from_the_environment():
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_PORT", "FERROCX_CONFIG")}
    p = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and "world one ok" in p.stdout, p.stdout + p.stderr
    assert "root error:" in p.stdout and "5" in p.stdout, p.stdout
    assert "order error:" in p.stdout, p.stdout


def test_a_bad_environment_is_an_error_not_a_crash():
    env = dict(os.environ, RANK="0", WORLD_SIZE="2")
    env.pop("MASTER_PORT", None)
    code = "import ferrocx\ntry:\n    ferrocx.Communicator.from_env()\nexcept ferrocx.Error as e:\n    print('error:', e)\n"
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and "error:" in p.stdout and "MASTER_PORT" in p.stdout, p.stdout + p.stderr
