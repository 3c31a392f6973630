#!/usr/bin/env bash
# Every test of the workspace, from a fresh machine.
#
# Installs what the tests need into a virtual environment (`.venv` at the repository root, or
# `$FERROCX_VENV`), reusing what an earlier run installed: the packages of
# `scripts/test-requirements.txt` (MPI from its PyPI wheel, PyTorch, pytest, maturin). Then runs
# `cargo test --workspace` with the environment's `bin/` first on PATH, so tests find `mpiexec`
# and `python`, installs the Python package (python/), builds its torch backend's native side
# and runs its tests.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
venv=${FERROCX_VENV:-$root/.venv}

echo "== test environment: $venv"
if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv"
fi
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r scripts/test-requirements.txt
export PATH="$venv/bin:$PATH"
export FERROCX_VENV="$venv"

echo "== cargo test --workspace"
cargo test --workspace

# The Python package, rebuilt and reinstalled each run (the dev profile: it shares the build
# above), then its tests: the torch.distributed backend against gloo, in jobs of real processes.
echo "== pip install ./python"
MATURIN_PEP517_ARGS="--profile dev" "$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
    --no-build-isolation --no-deps --force-reinstall ./python
# The torch backend's native side, built once against this environment's torch (kept in the
# user's cache; a changed source or another torch builds anew): a build failure stops here
# with the compiler's message rather than inside a test job.
echo "== python -m ferrocx._native"
"$venv/bin/python" -m ferrocx._native
echo "== python -m pytest python/tests -q"
"$venv/bin/python" -m pytest python/tests -q
