"""ferrocx from Python.

``ferrocx.Communicator.from_env()`` makes this process's communicator from the environment
(the configuration named by ``FERROCX_CONFIG``, else the local one; the rank and world from
``RANK``/``WORLD_SIZE`` as ``torchrun`` and ``ferrocx launch`` set them), with its ``rank``,
``world`` and ``cluster``, and every collective on raw addresses and a stream handle.
``ferrocx.info()`` is what ``ferrocx info`` shows. ``import ferrocx.torch`` registers the
``"ferrocx"`` backend of ``torch.distributed``.

Every failure raises :class:`ferrocx.Error` (a ``RuntimeError``) with ferrocx's message.
"""

from ._ferrocx import (  # noqa: F401
    AVG,
    BF16,
    F16,
    F32,
    F64,
    I8,
    I32,
    I64,
    MAX,
    MIN,
    PROD,
    SUM,
    U8,
    U32,
    U64,
    Communicator,
    Error,
    info,
    store_exchange,
    __version__,
)

__all__ = ["Communicator", "Error", "info", "__version__"]
