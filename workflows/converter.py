"""Headway's payload converter: plain JSON, decoded through cached pydantic adapters.

Temporal's default JSON converter rebuilds a dataclass's type hints on every decode
(``typing.get_type_hints``, which compiles every annotation string again), about 0.4 ms
per ``DispatchRequest``. ``temporalio.contrib.pydantic`` compiles a validator once per
type, but keeps that cache on the converter instance, and the worker copies its
converter for every workflow run (serialization context), so each run starts cold and
pays more than the default. Here the cache is per process: one ``TypeAdapter`` per type
for the life of the worker.

The bytes are the same plain JSON either way (encoding ``json/plain``), so a client on
Temporal's default converter reads what Headway writes and the other way round.
"""

from __future__ import annotations

import functools
from typing import Any

from pydantic import TypeAdapter
from pydantic_core import to_json
from temporalio.api.common.v1 import Payload
from temporalio.converter import (
    CompositePayloadConverter,
    DataConverter,
    DefaultPayloadConverter,
    EncodingPayloadConverter,
    JSONPlainPayloadConverter,
)

__all__ = ["DATA_CONVERTER", "HeadwayPayloadConverter"]

_ENCODING = "json/plain"


@functools.lru_cache(maxsize=1024)
def _adapter(hint: Any) -> TypeAdapter[Any]:
    return TypeAdapter(hint)


class _JSONPlain(EncodingPayloadConverter):
    @property
    def encoding(self) -> str:
        return _ENCODING

    def to_payload(self, value: Any) -> Payload | None:
        return Payload(metadata={"encoding": _ENCODING.encode()}, data=to_json(value))

    def from_payload(self, payload: Payload, type_hint: type | None = None) -> Any:
        hint: Any = type_hint if type_hint is not None else Any
        try:
            adapter = _adapter(hint)
        except TypeError:
            try:
                hash(hint)
            except TypeError:  # unhashable hint (e.g. a parametrized Annotated): no cache
                adapter = TypeAdapter(hint)
            else:
                raise
        return adapter.validate_json(payload.data)


#: The encoding converters, stateless, shared by every ``HeadwayPayloadConverter``: the
#: worker builds a converter per activation and command (serialization contexts).
_CONVERTERS: tuple[EncodingPayloadConverter, ...] = tuple(
    _JSONPlain() if isinstance(c, JSONPlainPayloadConverter) else c
    for c in DefaultPayloadConverter.default_encoding_payload_converters
)


class HeadwayPayloadConverter(CompositePayloadConverter):
    """Temporal's default converters, with JSON through the process-wide adapter cache."""

    def __init__(self) -> None:
        super().__init__(*_CONVERTERS)


#: The data converter of every client Headway connects (see ``protocol.data_converter``).
DATA_CONVERTER = DataConverter(payload_converter_class=HeadwayPayloadConverter)
