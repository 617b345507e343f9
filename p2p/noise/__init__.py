"""The secret stream: Noise XX over any trio stream, keyed by Ed25519 identities.

See ``README.md`` in this folder for the wire format.
"""

from ._config import SecretStreamConfig
from ._handshake import NOISE_PROTOCOL_NAME, PROLOGUE, Handshake, HandshakePhase
from ._stream import SecretStream, SecretStreamStatistics
from ._transport import MAX_PLAINTEXT_BYTES, NEED_DATA, Data, EndOfStream, KeepAlive, Transport

__all__ = [
    "MAX_PLAINTEXT_BYTES",
    "NEED_DATA",
    "NOISE_PROTOCOL_NAME",
    "PROLOGUE",
    "Data",
    "EndOfStream",
    "Handshake",
    "HandshakePhase",
    "KeepAlive",
    "SecretStream",
    "SecretStreamConfig",
    "SecretStreamStatistics",
    "Transport",
]
