"""A small Kubernetes API server double over real HTTP, for the real ``kubernetes`` client.

It stores objects per (group/version, plural, namespace) and serves what the
``kubevirt`` backend calls: create (POST, 201; 409 if the name exists), get,
list (equality label selectors), replace (PUT), JSON merge patch (PATCH, also
on ``/status``), delete (honouring finalizers: the object gets a
``deletionTimestamp`` and goes once its finalizers are patched away) and
watch (``?watch=true``: chunked JSON lines, synthetic ``ADDED`` events for
what exists, then ``ADDED``/``MODIFIED``/``DELETED`` until
``timeoutSeconds``). The server assigns ``uid``, ``resourceVersion`` (one
counter) and ``creationTimestamp``, and a NodePort or LoadBalancer Service its
node ports, as the API server does.

It has no admission, no defaulting and no controllers: tests play the
controllers by patching ``status`` (what virt-controller and CDI would do)
through :meth:`KubeDouble.patch_status` or over HTTP.

What ``cosmicac doctor`` reads is served too: ``GET /version``
(:attr:`KubeDouble.version`), any custom resource stored with
:meth:`KubeDouble.put` (KubeVirt and CDI CRs, storage classes, network
attachment definitions), a resource the cluster does not serve (a CRD not
installed: :attr:`KubeDouble.unserved` answers 404), and
``SelfSubjectAccessReview``, answered from :attr:`KubeDouble.allowed`. The
double enforces no authorization itself; every request is recorded in
:attr:`KubeDouble.accesses` as the (group, resource, verb, namespace) the API
server's authorizer would see, so a test can hold them against RBAC rules.

Why our own and not kmock: kmock needs pytest-asyncio, whose loop fights
pytest-trio's ``trio_mode``, and it assigns no resourceVersion/uid
(reference/kubevirt-cdi-vllm.md §7).
"""

from __future__ import annotations

import copy
import json
import queue
import re
import threading
import time
import uuid
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

__all__ = ["Access", "KubeDouble", "access_of"]

_PATH = re.compile(
    r"^/(?:api/(?P<core>v1)|apis/(?P<group>[^/]+)/(?P<version>[^/]+))"
    r"(?:/namespaces/(?P<ns>[^/]+))?/(?P<plural>[^/]+)(?:/(?P<name>[^/]+))?(?:/(?P<sub>status))?$")

#: The longest a watch stays open, whatever the client asks (keeps shutdown quick);
#: a test may shorten it (:attr:`KubeDouble.max_watch_s`), as an API server ends a
#: watch before its ``timeoutSeconds`` whenever it likes.
_MAX_WATCH_S = 30.0
#: What ``GET /version`` answers unless a test sets :attr:`KubeDouble.version`.
DEFAULT_VERSION = {"major": "1", "minor": "31", "gitVersion": "v1.31.0-double",
                   "platform": "linux/amd64"}
_SSAR = ("authorization.k8s.io/v1", "selfsubjectaccessreviews")


@dataclass(frozen=True)
class Access:
    """One request as the API server's authorizer sees it (its request attributes).

    ``resource`` is empty and ``path`` set for a non-resource URL (``/version``);
    a subresource is ``resource/sub`` (``virtualmachineinstances/status``), as RBAC
    names it.
    """

    group: str
    resource: str
    verb: str
    namespace: str = ""
    path: str = ""


#: HTTP method → RBAC verb for a request that names one object (kube-apiserver's
#: RequestInfoResolver); a request for a collection maps GET to list or watch,
#: DELETE to deletecollection.
_VERBS = {"GET": "get", "POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}


def access_of(method: str, path: str, query: dict[str, list[str]]) -> Access:
    """The authorizer's attributes of ``method path?query``."""
    match = _PATH.match(path)
    if match is None:
        return Access("", "", _VERBS.get(method, method.lower()), "", path)
    group = "" if match["core"] else match["group"]
    resource = match["plural"] + (f"/{match['sub']}" if match["sub"] else "")
    verb = _VERBS.get(method, method.lower())
    if match["name"] is None and method == "GET":
        verb = "watch" if query.get("watch", ["false"])[0].lower() in ("true", "1") else "list"
    elif match["name"] is None and method == "DELETE":
        verb = "deletecollection"
    return Access(group, resource, verb, match["ns"] or "")


def _merge(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    if not isinstance(target, dict):
        target = {}
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        else:
            target[key] = _merge(target.get(key), value)
    return target


def _selector_matches(selector: str | None, labels: dict[str, str]) -> bool:
    if not selector:
        return True
    for term in selector.split(","):
        key, sep, value = term.partition("=")
        if not sep:
            if key.strip() not in labels:
                return False
            continue
        if labels.get(key.strip()) != value.lstrip("=").strip():
            return False
    return True


def _status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": message, "reason": reason, "code": code}


class KubeDouble:
    """The server and its store. Start with :meth:`start`, stop with :meth:`stop`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        #: (api, plural, namespace or "", name) -> object
        self.objects: dict[tuple[str, str, str, str], dict[str, Any]] = {}
        self._rv = 0
        self._watchers: list[tuple[str, str, str | None, str | None, queue.Queue]] = []
        #: Every request as (method, path), for assertions.
        self.requests: list[tuple[str, str]] = []
        #: Every request as the authorizer sees it (:func:`access_of`).
        self.accesses: list[Access] = []
        #: What ``GET /version`` answers.
        self.version: dict[str, str] = dict(DEFAULT_VERSION)
        #: (api, plural) the cluster does not serve (``("kubevirt.io/v1",
        #: "kubevirts")``: KubeVirt not installed): every request for them is a 404.
        self.unserved: set[tuple[str, str]] = set()
        #: (group, resource, verb) a ``SelfSubjectAccessReview`` allows; None: all.
        self.allowed: set[tuple[str, str, str]] | None = None
        #: Every ``SelfSubjectAccessReview`` asked, as its ``resourceAttributes``.
        self.reviews: list[dict[str, Any]] = []
        #: The longest a watch stays open before the double ends it.
        self.max_watch_s = _MAX_WATCH_S
        self._stopping = threading.Event()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        #: The base URL, once started.
        self.url = ""

    # -- lifecycle -----------------------------------------------------------
    def start(self) -> str:
        """Serve on 127.0.0.1 (a free port) in a thread; returns the base URL."""
        double = self

        class Handler(_Handler):
            store = double

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        # stop() waits for the loop to notice, one poll at most: a test's teardown.
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        kwargs={"poll_interval": 0.01}, daemon=True)
        self._thread.start()
        host, port = self._server.server_address[:2]
        self.url = f"http://{host}:{port}"
        return self.url

    def api_client(self) -> Any:
        """A ``kubernetes`` ``ApiClient`` for this double (a backend's or doctor's factory)."""
        from kubernetes import client

        configuration = client.Configuration()
        configuration.host = self.url
        return client.ApiClient(configuration)

    def kubeconfig(self, path: Any, token: str = "double-token") -> Any:
        """Write a kubeconfig naming this double (for the CLI); return its path."""
        import yaml

        path.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "double",
            "clusters": [{"name": "double", "cluster": {"server": self.url}}],
            "users": [{"name": "worker", "user": {"token": token}}],
            "contexts": [{"name": "double",
                          "context": {"cluster": "double", "user": "worker"}}]}))
        return path

    def stop(self) -> None:
        self._stopping.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    # -- store, used by the handler and by tests -------------------------------
    def _next_rv(self) -> str:
        self._rv += 1
        return str(self._rv)

    def _notify(self, kind: str, api: str, plural: str, obj: dict[str, Any]) -> None:
        namespace = obj["metadata"].get("namespace")
        labels = obj["metadata"].get("labels") or {}
        for w_api, w_plural, w_ns, w_selector, events in self._watchers:
            if (w_api, w_plural) == (api, plural) and w_ns in (None, namespace) \
                    and _selector_matches(w_selector, labels):
                events.put({"type": kind, "object": copy.deepcopy(obj)})

    def _next_node_port(self) -> int:
        taken = {port.get("nodePort") for (api, plural, _, _), obj in self.objects.items()
                 if (api, plural) == ("v1", "services")
                 for port in (obj.get("spec") or {}).get("ports") or ()}
        return next(port for port in range(30000, 32768) if port not in taken)

    def put(self, api: str, plural: str, obj: dict[str, Any]) -> dict[str, Any]:
        """Store ``obj`` as a create would (tests preload nodes this way)."""
        with self._lock:
            return self._create(api, plural, obj["metadata"].get("namespace") or "", obj)

    def _create(self, api: str, plural: str, ns: str, obj: dict[str, Any]) -> dict[str, Any]:
        obj = copy.deepcopy(obj)
        meta = obj.setdefault("metadata", {})
        if ns:
            meta["namespace"] = ns
        meta.update(uid=str(uuid.uuid4()), resourceVersion=self._next_rv(),
                    creationTimestamp=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
        spec = obj.get("spec") or {}
        if (api, plural) == ("v1", "services") and spec.get("type") in ("NodePort",
                                                                         "LoadBalancer"):
            # As the API server's service allocator: a node port per port, at create.
            for port in spec.get("ports") or ():
                port.setdefault("nodePort", self._next_node_port())
        self.objects[(api, plural, ns, meta["name"])] = obj
        self._notify("ADDED", api, plural, obj)
        return obj

    def get(self, api: str, plural: str, namespace: str, name: str) -> dict[str, Any] | None:
        with self._lock:
            found = self.objects.get((api, plural, namespace, name))
            return copy.deepcopy(found) if found is not None else None

    def names(self, api: str, plural: str, namespace: str) -> list[str]:
        with self._lock:
            return sorted(name for (a, p, ns, name) in self.objects
                          if (a, p, ns) == (api, plural, namespace))

    def patch(self, api: str, plural: str, namespace: str, name: str,
              patch: dict[str, Any]) -> dict[str, Any]:
        """Merge-patch an object (``{"status": …}`` plays a controller)."""
        with self._lock:
            return self._patch((api, plural, namespace, name), patch)

    def _patch(self, key: tuple[str, str, str, str], patch: dict[str, Any]) -> dict[str, Any]:
        obj = self.objects[key]
        patch = copy.deepcopy(patch)
        patch.get("metadata", {}).pop("resourceVersion", None)
        _merge(obj, patch)
        obj["metadata"]["resourceVersion"] = self._next_rv()
        if obj["metadata"].get("deletionTimestamp") and not obj["metadata"].get("finalizers"):
            del self.objects[key]
            self._notify("DELETED", key[0], key[1], obj)
        else:
            self._notify("MODIFIED", key[0], key[1], obj)
        return copy.deepcopy(obj)

    def _delete(self, key: tuple[str, str, str, str]) -> dict[str, Any]:
        obj = self.objects[key]
        if obj["metadata"].get("finalizers"):
            if not obj["metadata"].get("deletionTimestamp"):
                obj["metadata"]["deletionTimestamp"] = time.strftime(
                    "%Y-%m-%dT%H:%M:%SZ", time.gmtime())
                obj["metadata"]["resourceVersion"] = self._next_rv()
                self._notify("MODIFIED", key[0], key[1], obj)
            return copy.deepcopy(obj)
        del self.objects[key]
        obj["metadata"]["resourceVersion"] = self._next_rv()
        self._notify("DELETED", key[0], key[1], obj)
        return copy.deepcopy(obj)


class _Handler(BaseHTTPRequestHandler):
    store: KubeDouble
    protocol_version = "HTTP/1.1"
    #: TCP_NODELAY: a reply's headers and body go as two writes, and with Nagle the
    #: body waits for the client's delayed ACK of the headers (40 ms a request).
    disable_nagle_algorithm = True

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _send(self, code: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _body(self) -> Any:
        length = int(self.headers.get("Content-Length") or 0)
        return json.loads(self.rfile.read(length) or b"null")

    def _route(self) -> tuple[Any, dict[str, list[str]]] | None:
        url = urlsplit(self.path)
        query = parse_qs(url.query)
        self.store.requests.append((self.command, url.path))
        self.store.accesses.append(access_of(self.command, url.path, query))
        if url.path.rstrip("/") == "/version" and self.command == "GET":
            self._send(200, self.store.version)
            return None
        match = _PATH.match(url.path)
        if match is None:
            self._send(404, _status(404, "NotFound", f"no route {url.path}"))
            return None
        api = match["core"] or f"{match['group']}/{match['version']}"
        if (api, match["plural"]) in self.store.unserved:
            if self.command != "GET":
                self._body()  # read it, so the connection stays usable
            self._send(404, _status(404, "NotFound",
                                    "the server could not find the requested resource"))
            return None
        if (api, match["plural"]) == _SSAR and self.command == "POST":
            self._review(self._body())
            return None
        return match, query

    def _review(self, body: dict[str, Any]) -> None:
        """Answer a ``SelfSubjectAccessReview`` from :attr:`KubeDouble.allowed`."""
        attributes = (body.get("spec") or {}).get("resourceAttributes") or {}
        self.store.reviews.append(attributes)
        key = (attributes.get("group", ""), attributes.get("resource", ""),
               attributes.get("verb", ""))
        allowed = self.store.allowed is None or key in self.store.allowed
        reason = "" if allowed else "no RBAC rule allows it (the double's allowed set)"
        self._send(201, {**body, "status": {"allowed": allowed, "reason": reason}})

    def do_GET(self) -> None:
        routed = self._route()
        if routed is None:
            return
        m, query = routed
        api = m["core"] or f"{m['group']}/{m['version']}"
        ns, plural, name = m["ns"] or "", m["plural"], m["name"]
        selector = query.get("labelSelector", [None])[0]
        if name is not None:
            found = self.store.get(api, plural, ns, name)
            if found is None:
                self._send(404, _status(404, "NotFound", f'{plural} "{name}" not found'))
            else:
                self._send(200, found)
            return
        if query.get("watch", ["false"])[0].lower() in ("true", "1"):
            limit = self.store.max_watch_s
            timeout = float(query.get("timeoutSeconds", [limit])[0])
            self._watch(api, plural, m["ns"], selector, min(timeout, limit))
            return
        with self.store._lock:
            items = [copy.deepcopy(o) for (a, p, o_ns, _), o in self.store.objects.items()
                     if (a, p) == (api, plural) and (m["ns"] is None or o_ns == ns)
                     and _selector_matches(selector, o["metadata"].get("labels") or {})]
            rv = str(self.store._rv)
        self._send(200, {"apiVersion": "v1", "kind": "List", "items": items,
                         "metadata": {"resourceVersion": rv}})

    def _watch(self, api: str, plural: str, ns: str | None, selector: str | None,
               timeout_s: float) -> None:
        events: queue.Queue = queue.Queue()
        with self.store._lock:
            for (a, p, o_ns, _), obj in self.store.objects.items():
                if (a, p) == (api, plural) and ns in (None, o_ns) \
                        and _selector_matches(selector, obj["metadata"].get("labels") or {}):
                    events.put({"type": "ADDED", "object": copy.deepcopy(obj)})
            watcher = (api, plural, ns, selector, events)
            self.store._watchers.append(watcher)
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        deadline = time.monotonic() + timeout_s
        try:
            while time.monotonic() < deadline and not self.store._stopping.is_set():
                try:
                    event = events.get(timeout=0.05)
                except queue.Empty:
                    continue
                line = json.dumps(event).encode() + b"\n"
                self.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
                self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except OSError:
            pass  # the client went away
        finally:
            with self.store._lock:
                self.store._watchers.remove(watcher)

    def do_POST(self) -> None:
        routed = self._route()
        if routed is None:
            return
        m, _ = routed
        api = m["core"] or f"{m['group']}/{m['version']}"
        ns, plural = m["ns"] or "", m["plural"]
        body = self._body()
        name = body.get("metadata", {}).get("name")
        with self.store._lock:
            if (api, plural, ns, name) in self.store.objects:
                reply = (409, _status(409, "AlreadyExists", f'{plural} "{name}" already exists'))
            else:
                reply = (201, self.store._create(api, plural, ns, body))
        self._send(*reply)

    def _modify(self, replace: bool) -> None:
        routed = self._route()
        if routed is None:
            return
        m, _ = routed
        api = m["core"] or f"{m['group']}/{m['version']}"
        key = (api, m["plural"], m["ns"] or "", m["name"])
        body = self._body()
        with self.store._lock:
            current = self.store.objects.get(key)
            if current is None:
                reply = (404, _status(404, "NotFound", f'{m["plural"]} "{m["name"]}" not found'))
            elif replace:
                body["metadata"] = {**body.get("metadata", {}),
                                    **{k: current["metadata"][k] for k in
                                       ("uid", "creationTimestamp", "namespace")}}
                if "status" in current and "status" not in body:
                    body["status"] = current["status"]
                self.store.objects[key] = body
                reply = (200, self.store._patch(key, {}))
            else:
                reply = (200, self.store._patch(key, body))
        self._send(*reply)

    def do_PUT(self) -> None:
        self._modify(replace=True)

    def do_PATCH(self) -> None:
        if "merge-patch" not in (self.headers.get("Content-Type") or ""):
            self._body()
            self._send(415, _status(415, "UnsupportedMediaType", "merge patch only"))
            return
        self._modify(replace=False)

    def do_DELETE(self) -> None:
        routed = self._route()
        if routed is None:
            return
        m, _ = routed
        api = m["core"] or f"{m['group']}/{m['version']}"
        key = (api, m["plural"], m["ns"] or "", m["name"])
        self._body()
        with self.store._lock:
            if key not in self.store.objects:
                reply = (404, _status(404, "NotFound", f'{m["plural"]} "{m["name"]}" not found'))
            else:
                reply = (200, self.store._delete(key))
        self._send(*reply)
