"""The ``kubevirt`` backend: CDI DataVolumes and KubeVirt VMIs on a real cluster.

:mod:`.render` turns a replica into manifests (pure, no cluster needed; also
behind ``cosmicac k8s render``), :mod:`.status` maps watch events to
:class:`~nodes.k8s_worker.backend.VmiEvent`, :mod:`.backend` applies and
watches them through the official ``kubernetes`` client. The client is
imported only when a :class:`KubevirtBackend` connects, so rendering needs
neither the package's API machinery nor a cluster. See README.md.
"""

from .backend import KubevirtBackend
from .render import (
    cloud_init_user_data,
    render_datavolume,
    render_replica,
    render_secret,
    render_vmi,
)
from .settings import KubevirtSettings
from .status import StatusTracker

__all__ = [
    "KubevirtBackend",
    "KubevirtSettings",
    "StatusTracker",
    "cloud_init_user_data",
    "render_datavolume",
    "render_replica",
    "render_secret",
    "render_vmi",
]
