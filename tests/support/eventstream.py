"""AWS event-stream framing (``application/vnd.amazon.eventstream``), the encoding side.

SageMaker's ``InvokeEndpointWithResponseStream`` answers with a binary event stream whose events
are ``PayloadPart`` (``Bytes``: a piece of the container's response) or an exception such as
``ModelStreamError``. The local runtime stand-in (``tests/support/runtime_standin.py``) writes this
framing so that botocore's own event-stream parser reads it, CRCs included.

A message is: prelude (total length u32, headers length u32), prelude CRC32, headers, payload,
message CRC32 — all big-endian. A header is name length u8, name, value type u8 (7 = string),
value length u16, value. ("Event Stream Encoding", https://docs.aws.amazon.com/transcribe/latest/dg/streaming-setting-up.html#streaming-event-stream,
and botocore/eventstream.py, which decodes it.) Pure module.
"""

from __future__ import annotations

import json
import struct
import zlib
from collections.abc import Mapping

STRING_HEADER = 7
PRELUDE_BYTES = 8
MAX_HEADER_VALUE_BYTES = 32767


def _header(name: str, value: str) -> bytes:
    raw_name, raw_value = name.encode("utf-8"), value.encode("utf-8")
    if len(raw_name) > 255 or len(raw_value) > MAX_HEADER_VALUE_BYTES:
        raise ValueError(f"event-stream header {name!r} is too long")
    return (struct.pack(">B", len(raw_name)) + raw_name
            + struct.pack(">BH", STRING_HEADER, len(raw_value)) + raw_value)


def encode_message(headers: Mapping[str, str], payload: bytes) -> bytes:
    """One event-stream message with string headers."""
    raw_headers = b"".join(_header(name, value) for name, value in headers.items())
    total = PRELUDE_BYTES + 4 + len(raw_headers) + len(payload) + 4
    prelude = struct.pack(">II", total, len(raw_headers))
    prelude_crc = struct.pack(">I", zlib.crc32(prelude) & 0xFFFFFFFF)
    body = prelude + prelude_crc + raw_headers + payload
    return body + struct.pack(">I", zlib.crc32(body) & 0xFFFFFFFF)


def payload_part(data: bytes) -> bytes:
    """A ``PayloadPart`` event carrying ``data`` as its ``Bytes`` member."""
    return encode_message(
        {":event-type": "PayloadPart", ":content-type": "application/octet-stream",
         ":message-type": "event"},
        data,
    )


def model_stream_error(message: str, error_code: str = "ModelStreamError") -> bytes:
    """A ``ModelStreamError`` exception event (the stream broke inside the model container)."""
    return encode_message(
        {":exception-type": "ModelStreamError", ":content-type": "application/json",
         ":message-type": "exception"},
        json.dumps({"Message": message, "ErrorCode": error_code}).encode("utf-8"),
    )
