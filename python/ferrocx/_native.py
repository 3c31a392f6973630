"""The native side of the torch backend: ``csrc/torch_backend.cpp``, built against the torch
that imports it, the first time it is needed, and kept.

Why native: DDP's reducer calls ``ProcessGroup.allreduce`` once per gradient bucket from its
autograd thread. A process group written in Python costs that thread the interpreter on every
call (60-90 us a bucket on H100s and H200s, where torch's NCCL backend spends a few), which the
backward pass waits for. The native backend takes that call in C++ (see the source's comment)
and hands every other call to the Python process group.

The build: torch's C++ extension builder (``torch.utils.cpp_extension.load``: a C++ compiler,
ninja, the interpreter's headers), into ``$FERROCX_CACHE_DIR/torch-native/<key>`` (else
``$XDG_CACHE_HOME/ferrocx/...``, else ``~/.cache/ferrocx/...``), the key naming the source, torch
and the interpreter, so a changed source or another torch builds anew. Ranks that start
together build once (the builder's lock in that directory). ``python -m ferrocx._native``
builds it ahead of a job and prints where.

``FERROCX_TORCH_NATIVE=0`` keeps everything in Python. A build that fails (no compiler, no
headers) warns once, with the builder's reason, and the Python process group takes every call:
slower per bucket, the same results.
"""

from __future__ import annotations

import hashlib
import os
import sys
import sysconfig
import warnings
from pathlib import Path
from typing import Optional

_SOURCE = Path(__file__).with_name("csrc") / "torch_backend.cpp"
_module = None
_failure: Optional[str] = None


def enabled() -> bool:
    """Whether the native backend is wanted (``FERROCX_TORCH_NATIVE`` is not ``0``)."""
    return os.environ.get("FERROCX_TORCH_NATIVE", "1").strip() != "0"


def _cache_root() -> Path:
    d = os.environ.get("FERROCX_CACHE_DIR")
    if d:
        return Path(d)
    x = os.environ.get("XDG_CACHE_HOME")
    return (Path(x) if x else Path.home() / ".cache") / "ferrocx"


def _key(torch) -> str:
    h = hashlib.sha256()
    h.update(_SOURCE.read_bytes())
    h.update(torch.__version__.encode())
    h.update(str(getattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", "")).encode())
    h.update(sys.version.encode())
    h.update((sysconfig.get_config_var("SOABI") or "").encode())
    return h.hexdigest()[:16]


def build():
    """The native module: loaded if built, else built now (raises on failure)."""
    global _module
    if _module is not None:
        return _module
    import torch
    from torch.utils import cpp_extension

    key = _key(torch)
    where = _cache_root() / "torch-native" / key
    where.mkdir(parents=True, exist_ok=True)
    # torch's version for the source's feature checks (the headers' own macro moved between
    # releases).
    major, minor = (int(x) for x in torch.__version__.split("+")[0].split(".")[:2])
    _module = cpp_extension.load(
        name=f"ferrocx_torch_native_{key}",
        sources=[str(_SOURCE)],
        build_directory=str(where),
        extra_cflags=["-O2", f"-DFX_TORCH_MAJOR={major}", f"-DFX_TORCH_MINOR={minor}"],
        verbose=os.environ.get("FERROCX_TORCH_NATIVE_VERBOSE", "0") == "1",
    )
    return _module


def module():
    """The native module, or None: not wanted, or its build failed (warned once)."""
    global _failure
    if not enabled():
        return None
    if _failure is not None:
        return None
    try:
        return build()
    except Exception as e:  # noqa: BLE001 - any failure of the build means the Python path
        _failure = f"{type(e).__name__}: {e}".strip()
        warnings.warn(
            "ferrocx: the native torch backend could not be built, so every call goes through "
            f"the Python process group (slower per call, the same results): {_failure[-2000:]}",
            RuntimeWarning,
            stacklevel=2,
        )
        return None


def failure() -> Optional[str]:
    """Why the native backend is not in use, if its build failed."""
    return _failure


if __name__ == "__main__":
    m = build()
    print(f"ferrocx: native torch backend built: {m.__file__}")
