"""The secret stream: Noise XX over any trio stream, keyed by Ed25519 identities.

See ``README.md`` in this folder for the wire format.
"""

from ._config import SecretStreamConfig
from ._handshake import NOISE_PROTOCOL_NAME, PROLOGUE, Handshake, HandshakePhase
from ._stream import SecretStream, SecretStreamStatistics
from ._transport import (
    MAX_PLAINTEXT_BYTES,
    NEED_DATA,
    PATH_ID_BYTES,
    Data,
    EndOfStream,
    KeepAlive,
    Migrate,
    Transport,
)

__all__ = [
    "MAX_PLAINTEXT_BYTES",
    "NEED_DATA",
    "NOISE_PROTOCOL_NAME",
    "PATH_ID_BYTES",
    "PROLOGUE",
    "Data",
    "EndOfStream",
    "Handshake",
    "HandshakePhase",
    "KeepAlive",
    "Migrate",
    "SecretStream",
    "SecretStreamConfig",
    "SecretStreamStatistics",
    "Transport",
]
