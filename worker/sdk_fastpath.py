"""Skip the Temporal Python SDK's payload walks where they cannot change anything.

temporalio 1.35 walks every payload of every workflow activation three times on the way
in (reference markers, external storage, codec) and every payload of every completion
three times on the way out, whatever the data converter is. With neither a payload codec
nor external storage configured, each walk is the identity: the payloads come back
unchanged. The walks are not free, though: py-spy put them at 18% of the control-plane
worker's CPU (Headway's workers run many short activations: local activities, signals,
the scheduler's passes).

:func:`install` wraps the SDK's two entry points so that they return at once when the
converter they are given has no codec and no external storage, and call the SDK as
before otherwise (a codec set per client, or one added later, is honoured). It is
process-wide and idempotent, applies only when the SDK's functions have the signature it
was written against, and ``HEADWAY_SDK_FASTPATH=0`` turns it off. The one behaviour it
drops is an error: a payload that was stored externally reaching a worker configured
without external storage fails in the SDK's walk; with the fast path it fails later, at
decoding, as an unreadable payload.
"""

from __future__ import annotations

import functools
import inspect
import os
from collections.abc import Awaitable, Callable
from typing import Any

import temporalio.bridge.worker as bridge_worker
from temporalio.converter import DataConverter

__all__ = ["install", "installed"]

_EXPECTED = {
    "decode_activation": ["activation", "data_converter", "decode_headers"],
    "encode_completion": ["completion", "data_converter", "encode_headers"],
}

_MARK = "__headway_fastpath__"


def _inert(dc: DataConverter) -> bool:
    """Whether every payload walk with ``dc`` is the identity."""
    return dc.payload_codec is None and getattr(dc, "external_storage", None) is None


def _wrap(fn: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    @functools.wraps(fn)
    async def fast(proto: Any, data_converter: DataConverter, *args: Any, **kwargs: Any) -> Any:
        if _inert(data_converter):
            # What the SDK returns when nothing was stored or retrieved externally.
            return _empty_metrics()
        return await fn(proto, data_converter, *args, **kwargs)

    setattr(fast, _MARK, fn)
    return fast


def _empty_metrics() -> Any:
    return _metrics_class()()


@functools.cache
def _metrics_class() -> Any:
    import temporalio.converter._extstore as extstore

    return extstore.StorageOperationMetrics


def _compatible() -> bool:
    for name, params in _EXPECTED.items():
        fn = getattr(bridge_worker, name, None)
        if fn is None or not inspect.iscoroutinefunction(fn):
            return False
        got = list(inspect.signature(fn).parameters)
        if got[: len(params)] != params:
            return False
    try:
        _empty_metrics()
    except (ImportError, AttributeError, TypeError):
        return False
    return True


def installed() -> bool:
    """Whether the fast path is in place in this process."""
    return all(hasattr(getattr(bridge_worker, n), _MARK) for n in _EXPECTED)


def install() -> bool:
    """Put the fast path in place (once per process).

    Returns:
        Whether it is in place: False when ``HEADWAY_SDK_FASTPATH=0`` or when the SDK's
        functions are not the ones it was written against.
    """
    if installed():
        return True
    if os.environ.get("HEADWAY_SDK_FASTPATH", "1") == "0" or not _compatible():
        return False
    for name in _EXPECTED:
        setattr(bridge_worker, name, _wrap(getattr(bridge_worker, name)))
    return True


def uninstall() -> None:
    """Restore the SDK's own functions (tests)."""
    for name in _EXPECTED:
        fn = getattr(bridge_worker, name)
        original = getattr(fn, _MARK, None)
        if original is not None:
            setattr(bridge_worker, name, original)
