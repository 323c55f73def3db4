"""The wire contract between agents and the coordinator (docs/protocol.md).

Pure: message types, the orjson codec and HMAC signing. No I/O, no clock:
callers pass times and nonces in, so both sides and the tests agree exactly.
"""

from vast_manager.protocol.codec import decode, encode
from vast_manager.protocol.errors import ProtocolError
from vast_manager.protocol.messages import (
    PROTOCOL_VERSION,
    SUPPORTED_PROTOCOLS,
    CpuTelemetry,
    CuzkTelemetry,
    CuzkWorker,
    Directive,
    ErrorBody,
    Gpu,
    GpuTelemetry,
    Heartbeat,
    Hello,
    HostInfo,
    LogBatch,
    LogLine,
    NetTelemetry,
    Progress,
    RamTelemetry,
    Result,
    ResultAck,
    ScalingRun,
    Telemetry,
)

__all__ = [
    "PROTOCOL_VERSION",
    "SUPPORTED_PROTOCOLS",
    "CpuTelemetry",
    "CuzkTelemetry",
    "CuzkWorker",
    "Directive",
    "ErrorBody",
    "Gpu",
    "GpuTelemetry",
    "Heartbeat",
    "Hello",
    "HostInfo",
    "LogBatch",
    "LogLine",
    "NetTelemetry",
    "Progress",
    "ProtocolError",
    "RamTelemetry",
    "Result",
    "ResultAck",
    "ScalingRun",
    "Telemetry",
    "decode",
    "encode",
]
