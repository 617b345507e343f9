"""RPC over a mux channel: typed methods, errors with codes, timeouts,
cancellation and server-streamed responses (a hyperswarm-rpc/HRPC analogue).

See ``README.md`` in this folder for the wire format.
"""

from p2p.rpc._access import FORBIDDEN, AccessStatistics, AccessTable, Guard
from p2p.rpc._channels import keep_client_channel
from p2p.rpc._client import ClientStatistics, ItemStream, RpcClient
from p2p.rpc._config import RpcConfig
from p2p.rpc._core import ProtocolViolation, RpcClientCore, RpcServerCore
from p2p.rpc._errors import (
    RpcChannelClosed,
    RpcError,
    RpcProtocolError,
    RpcTimeout,
    RpcUsageError,
)
from p2p.rpc._method import Method, StreamMethod
from p2p.rpc._server import (
    CallContext,
    PeerConnection,
    Router,
    RpcServer,
    ServerStatistics,
    serve_rpc,
)

__all__ = [
    "FORBIDDEN",
    "AccessStatistics",
    "AccessTable",
    "CallContext",
    "ClientStatistics",
    "Guard",
    "ItemStream",
    "Method",
    "PeerConnection",
    "ProtocolViolation",
    "Router",
    "RpcChannelClosed",
    "RpcClient",
    "RpcClientCore",
    "RpcConfig",
    "RpcError",
    "RpcProtocolError",
    "RpcServer",
    "RpcServerCore",
    "RpcTimeout",
    "RpcUsageError",
    "ServerStatistics",
    "StreamMethod",
    "keep_client_channel",
    "serve_rpc",
]
