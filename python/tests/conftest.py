"""Helpers of the Python tests: jobs of real processes under torchrun or `ferrocx launch`."""

import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
WORKERS = HERE / "workers"
ROOT = HERE.parent.parent

HOW = "run `bash scripts/test.sh`, which installs torch, pytest and this package into .venv"


def _require(module):
    try:
        return __import__(module)
    except ImportError as e:  # a missing dependency fails the run, it never skips it
        pytest.fail(f"{module} cannot be imported ({e}): {HOW}", pytrace=False)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ferrocx_cli():
    """The `ferrocx` command: $FERROCX_CLI, else the workspace's build (`cargo test` builds it)."""
    env = os.environ.get("FERROCX_CLI")
    if env:
        return env
    for profile in ("debug", "release"):
        p = ROOT / "target" / profile / "ferrocx"
        if p.is_file():
            return str(p)
    found = shutil.which("ferrocx")
    if found:
        return found
    pytest.fail(f"the ferrocx command is not built (target/debug/ferrocx): {HOW}", pytrace=False)


class Job:
    """A finished job: its exit status and its ranks' output together."""

    def __init__(self, proc, argv):
        self.rc = proc.returncode
        self.out = proc.stdout
        self.argv = argv

    def lines(self, marker):
        """Every printing of `marker` (ranks' lines can interleave in the job's output)."""
        return [marker] * self.out.count(marker)

    def expect_ok(self, marker, ranks):
        """Exit 0, and `marker` printed by each of `ranks` ranks."""
        got = self.lines(marker)
        assert self.rc == 0 and len(got) == ranks, (
            f"{' '.join(self.argv)} exited {self.rc}; {len(got)} of {ranks} ranks printed {marker!r}:\n"
            + self.out[-6000:]
        )


def run_job(worker, nproc, *args, env=None, launcher="torchrun", timeout=240):
    """Runs `workers/<worker>` on `nproc` ranks of this host."""
    _require("torch")
    base = dict(os.environ)
    base.update(
        PYTHONUNBUFFERED="1",
        OMP_NUM_THREADS="1",
        TORCH_CPP_LOG_LEVEL="ERROR",
        FERROCX_LOG=base.get("FERROCX_LOG", "error"),
    )
    base.pop("FERROCX_CONFIG", None)
    base.update(env or {})
    script = str(WORKERS / worker)
    if launcher == "torchrun":
        argv = [
            sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc),
            "--master-addr", "127.0.0.1", "--master-port", str(free_port()), script, *args,
        ]
    else:
        argv = [ferrocx_cli(), "launch", "-n", str(nproc), "--", sys.executable, script, *args]
    try:
        proc = subprocess.run(
            argv, env=base, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        pytest.fail(f"{' '.join(argv)} did not finish in {timeout} s (a hang):\n{out[-6000:]}", pytrace=False)
    return Job(proc, argv)


def two_cluster_config(tmp_path, first, world):
    """Two host-device clusters in one configuration: ranks 0..first-1 and first..world-1,
    bridged over shared memory (the CPU-only stand-in of a GPU cluster beside a CPU one)."""
    p = tmp_path / "two-clusters.toml"
    p.write_text(
        f"""[runtime]
timeout_ms = 30000

[[cluster]]
name = "left"
ranks = "0-{first - 1}"
device = "host"
ccl = "host"

[[cluster]]
name = "right"
ranks = "{first}-{world - 1}"
device = "host"
ccl = "host"

[bridge]
ccl = "host"
chunk_bytes = 4096
depth = 2
"""
    )
    return str(p)
