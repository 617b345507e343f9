"""The daemon kit: what every long-lived process of the stack and platform shares.

- :class:`DaemonSettings` and :func:`load_settings`: one pydantic-settings
  model per daemon, read from defaults < a config file < the environment
  (``COSMICAC_<DAEMON>__KEY__NESTED``, JSON values for lists) < command-line
  options; a bad value is a :class:`ConfigError` naming its key.
- :func:`configure_logging`: text on a terminal, JSON lines otherwise.
- :class:`~p2p.metrics.ProcessMetrics`: one Prometheus endpoint per process.
- :func:`lock_storage`: one daemon per storage folder.
- :func:`run_daemon`: all of the above, then a clean stop on SIGINT/SIGTERM.

See ``p2p/daemon/README.md`` for a daemon written on it.
"""

from ..files import (
    PRIVATE_FILE_MODE,
    PRIVATE_FOLDER_MODE,
    private_file,
    private_folder,
    sync_directory,
    write_atomically,
)
from ..metrics import MetricsBindError, ProcessMetrics
from ._lock import LOCK_FILE, StorageInUse, StorageLock, StorageUnusable, lock_storage
from ._logging import JsonFormatter, configure_logging
from ._run import Daemon, DaemonError, fatal, run_daemon, run_until_signalled
from ._settings import ConfigError, DaemonSettings, MetricsSettings, load_settings
from ._types import (
    Address,
    AddressList,
    LogFormat,
    LogLevel,
    Port,
    PublicKey,
    PublicKeyList,
    StrList,
    parse_address,
    split_list,
)

__all__ = [
    "LOCK_FILE",
    "PRIVATE_FILE_MODE",
    "PRIVATE_FOLDER_MODE",
    "Address",
    "AddressList",
    "ConfigError",
    "Daemon",
    "DaemonError",
    "DaemonSettings",
    "JsonFormatter",
    "LogFormat",
    "LogLevel",
    "MetricsBindError",
    "MetricsSettings",
    "Port",
    "ProcessMetrics",
    "PublicKey",
    "PublicKeyList",
    "StorageInUse",
    "StorageLock",
    "StorageUnusable",
    "StrList",
    "configure_logging",
    "fatal",
    "load_settings",
    "lock_storage",
    "parse_address",
    "private_file",
    "private_folder",
    "run_daemon",
    "run_until_signalled",
    "split_list",
    "sync_directory",
    "write_atomically",
]
