"""The kubevirt backend through the real ``kubernetes`` client against an HTTP API double.

Real sockets and worker threads, so these run in real time: every wait is on
a condition, under a ``trio.fail_after`` bound. The tests play KubeVirt's and
CDI's controllers by patching ``status`` (and finalizers) in the double.
"""

import json

import pytest
import trio
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from nodes.k8s_worker.backend import BackendError, VmiPhase
from nodes.k8s_worker.kubevirt.backend import (
    KubevirtBackend,
    _api_error,
    discover_gpu_resource,
)
from nodes.k8s_worker.kubevirt.render import secret_name, service_name
from nodes.k8s_worker.kubevirt.settings import KubevirtSettings

from .kube_double import KubeDouble
from .schema_check import validate
from .units import H100, container_unit, vllm_unit

pytestmark = pytest.mark.slow

NS = "cosmicac"
VMIS = ("kubevirt.io/v1", "virtualmachineinstances")
DVS = ("cdi.kubevirt.io/v1beta1", "datavolumes")
SECRETS = ("v1", "secrets")
SERVICES = ("v1", "services")
SETTINGS = KubevirtSettings(namespace=NS, poll_interval_s=0.05, delete_timeout_s=10,
                            watch_timeout_s=5, request_timeout_s=5,
                            overlay_network="cosmicac/vllm-overlay",
                            infiniband_resource="nvidia.com/mlx5_ib")
#: Bound of every test's waits (real time: threads and sockets).
LIMIT_S = 15


def _node(name, allocatable, ready=True, unschedulable=False):
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name},
            "spec": {"unschedulable": unschedulable},
            "status": {"allocatable": allocatable,
                       "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}


@pytest.fixture
def double():
    server = KubeDouble()
    url = server.start()
    server.url = url
    h100 = {"cpu": "128", "memory": "2Ti", H100: "8", "nvidia.com/mlx5_ib": "1"}
    server.put("v1", "nodes", _node("gpu-node-1", h100))
    server.put("v1", "nodes", _node("gpu-node-2", h100))
    server.put("v1", "nodes", _node("gpu-node-3", {**h100, "nvidia.com/mlx5_ib": "0"},
                                    unschedulable=True))
    server.put("v1", "nodes", _node("cpu-node-1", {"cpu": "64", "nvidia.com/gpu": "0"}))
    yield server
    server.stop()


def _backend(double, settings=SETTINGS):
    def factory():
        configuration = client.Configuration()
        configuration.host = double.url
        return client.ApiClient(configuration)

    return KubevirtBackend(settings, factory)


async def _wait_event(events, name, phase, message=None):
    """Receive until an event for ``name`` in ``phase`` (and with ``message``) arrives."""
    seen = []
    with trio.fail_after(LIMIT_S):
        async for event in events:
            seen.append(event)
            if event.name == name and event.phase is phase and (
                    message is None or event.message == message):
                return event
    raise AssertionError(f"stream ended; saw {seen}")


async def _wait_until(predicate):
    with trio.fail_after(LIMIT_S):
        while not predicate():  # noqa: ASYNC110 - state changes in the double's threads
            await trio.sleep(0.02)


async def test_capacity_reports_nodes_gpus_infiniband_and_schedulability(double):
    report = await _backend(double).capacity()
    nodes = {node.name: node for node in report.nodes}
    assert nodes["gpu-node-1"].gpus == 8 and nodes["gpu-node-1"].gpu_resource == H100
    assert nodes["gpu-node-1"].infiniband and nodes["gpu-node-1"].schedulable
    assert not nodes["gpu-node-3"].schedulable and not nodes["gpu-node-3"].infiniband
    assert nodes["cpu-node-1"].gpus == 0 and nodes["cpu-node-1"].gpu_resource is None
    assert report.overlay_network


async def test_configured_gpu_resource_wins_over_discovery(double):
    settings = SETTINGS.model_copy(update={"gpu_resource": "nvidia.com/gpu"})
    report = await _backend(double, settings).capacity()
    assert all(node.gpus == 0 for node in report.nodes)


def test_discovery_ignores_zero_pools_and_prefers_the_larger():
    assert discover_gpu_resource({"nvidia.com/A": "0", "cpu": "8"}) is None
    assert discover_gpu_resource({"nvidia.com/A": "2", "nvidia.com/B": "8"}) == "nvidia.com/B"


async def test_create_watch_restart_delete(double, nursery):
    backend = _backend(double)
    send, events = trio.open_memory_channel(100)
    await nursery.start(backend.run, send)
    unit = container_unit(node="gpu-node-1", gpus=2)
    vmi, disk = unit.vmis[0].name, unit.vmis[0].disk
    secret = secret_name(vmi)

    await backend.create(unit)
    stored = [double.get(*SECRETS, NS, secret), double.get(*DVS, NS, disk),
              double.get(*VMIS, NS, vmi)]
    for obj in stored:
        for server_field in ("uid", "resourceVersion", "creationTimestamp"):
            del obj["metadata"][server_field]
        validate(obj)
    uids = {key: double.get(*key, NS, name)["metadata"]["uid"]
            for key, name in ((SECRETS, secret), (DVS, disk), (VMIS, vmi))}
    await backend.create(unit)  # redelivered: 409s are successes, nothing replaced
    assert uids == {key: double.get(*key, NS, name)["metadata"]["uid"]
                    for key, name in ((SECRETS, secret), (DVS, disk), (VMIS, vmi))}

    # CDI imports the disk while KubeVirt holds the VMI in Provisioning.
    double.patch(*DVS, NS, disk, {"status": {"phase": "ImportInProgress", "progress": "40.0%"}})
    await _wait_event(events, vmi, VmiPhase.PROVISIONING, "DataVolume importing 40.0%")
    double.patch(*DVS, NS, disk, {"status": {"phase": "Succeeded", "progress": "100.0%"}})
    await _wait_event(events, vmi, VmiPhase.PROVISIONING, "DataVolume imported")
    double.patch(*VMIS, NS, vmi, {"status": {"phase": "Scheduled", "nodeName": "gpu-node-1"}})
    event = await _wait_event(events, vmi, VmiPhase.BOOTING)
    assert event.message == "VMI scheduled on gpu-node-1" and event.node == "gpu-node-1"
    double.patch(*VMIS, NS, vmi, {
        "metadata": {"finalizers": ["kubevirt.io/virtualMachineControllerFinalize"]},
        "status": {"phase": "Running",
                   "conditions": [{"type": "Ready", "status": "True"}]}})
    await _wait_event(events, vmi, VmiPhase.RUNNING, "VMI running on gpu-node-1, ready")

    # Restart: the VMI is deleted, and re-created only once really gone.
    restarted = container_unit(node="gpu-node-1", gpus=2, generation=1)
    done = trio.Event()

    async def restart():
        await backend.restart(restarted)
        done.set()

    nursery.start_soon(restart)
    await _wait_until(lambda: "deletionTimestamp" in double.get(*VMIS, NS, vmi)["metadata"])
    await trio.sleep(0.2)  # several polls: still terminating, so no re-create yet
    assert not done.is_set()
    double.patch(*VMIS, NS, vmi, {"metadata": {"finalizers": None}})
    await _wait_event(events, vmi, VmiPhase.GONE)
    with trio.fail_after(LIMIT_S):
        await done.wait()
    assert double.get(*VMIS, NS, vmi)["metadata"]["uid"] != uids[VMIS]
    assert double.get(*DVS, NS, disk)["metadata"]["uid"] == uids[DVS]  # the disk is kept
    renewed = double.get(*SECRETS, NS, secret)
    assert renewed["metadata"]["labels"]["cosmicac.io/generation"] == "1"
    await _wait_event(events, vmi, VmiPhase.SCHEDULING, "VMI pending")

    await backend.delete(restarted)
    assert double.get(*VMIS, NS, vmi) is None
    assert double.get(*DVS, NS, disk) is None
    assert double.get(*SECRETS, NS, secret) is None
    await _wait_event(events, vmi, VmiPhase.GONE)
    await backend.delete(restarted)  # again: 404s are successes


async def test_failures_map_to_events(double, nursery):
    backend = _backend(double)
    send, events = trio.open_memory_channel(100)
    await nursery.start(backend.run, send)
    unit = vllm_unit()
    await backend.create(unit)
    assert double.names(*VMIS, NS) == sorted(v.name for v in unit.vmis)
    head, worker = unit.vmis
    double.patch(*VMIS, NS, head.name, {"status": {"phase": "Scheduling", "conditions": [
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
         "message": "0/4 nodes are available: 4 Insufficient nvidia.com/GH100"}]}})
    await _wait_event(events, head.name, VmiPhase.SCHEDULING,
                      "VMI unschedulable: 0/4 nodes are available: 4 Insufficient "
                      "nvidia.com/GH100")
    double.patch(*DVS, NS, worker.disk, {"status": {"phase": "Failed", "conditions": [
        {"type": "Running", "status": "False", "message": "Unable to connect to registry"}]}})
    await _wait_event(events, worker.name, VmiPhase.FAILED,
                      "DataVolume import failed: Unable to connect to registry")
    double.patch(*VMIS, NS, head.name, {"status": {"phase": "Failed", "reason": "Crashed"}})
    await _wait_event(events, head.name, VmiPhase.FAILED, "VMI failed: Crashed")


def _uid(double, key, name):
    return double.get(*key, NS, name)["metadata"]["uid"]


async def test_a_multi_node_replica_gets_a_headless_service_kept_on_restart(double):
    backend = _backend(double)
    unit = vllm_unit()
    service = service_name(unit)

    await backend.create(unit)
    stored = double.get(*SERVICES, NS, service)
    assert stored["spec"]["clusterIP"] == "None"
    for server_field in ("uid", "resourceVersion", "creationTimestamp"):
        del stored["metadata"][server_field]
    validate(stored)
    assert [double.get(*VMIS, NS, v.name)["spec"]["subdomain"] for v in unit.vmis] == [
        service, service]
    uid = _uid(double, SERVICES, service)
    await backend.create(unit)  # redelivered: the 409 is a success, nothing replaced
    assert _uid(double, SERVICES, service) == uid

    await backend.restart(vllm_unit(generation=1))  # no finalizers: the VMIs go at once
    assert _uid(double, SERVICES, service) == uid  # kept
    assert all(double.get(*SECRETS, NS, secret_name(v.name))["metadata"]["labels"]
               ["cosmicac.io/generation"] == "1" for v in unit.vmis)

    await backend.delete(unit)
    assert double.get(*SERVICES, NS, service) is None
    assert double.names(*VMIS, NS) == [] and double.names(*SECRETS, NS) == []
    await backend.delete(unit)  # again: 404s are successes


async def test_a_single_node_replica_gets_no_service(double):
    backend = _backend(double)
    unit = container_unit()
    await backend.create(unit)
    await backend.delete(unit)
    assert double.names(*SERVICES, NS) == []
    assert not any("/services" in path for _, path in double.requests)


async def test_watch_resumes_after_the_server_ends_it(double, nursery):
    # The server ends each watch after 0.2 s, long before the 5 s asked for (an API
    # server may end one whenever it likes, and does at timeoutSeconds).
    double.max_watch_s = 0.2
    backend = _backend(double)
    send, events = trio.open_memory_channel(100)
    await nursery.start(backend.run, send)
    unit = container_unit()
    await backend.create(unit)
    await _wait_until(lambda: sum(1 for method, path in double.requests
                                  if method == "GET" and path.endswith("/datavolumes")) >= 3)
    vmi = unit.vmis[0].name
    double.patch(*VMIS, NS, vmi, {"status": {"phase": "Running", "nodeName": "gpu-node-1"}})
    await _wait_event(events, vmi, VmiPhase.RUNNING)


async def test_unknown_node_is_a_permanent_error(double):
    with pytest.raises(BackendError) as caught:
        await _backend(double).create(container_unit(node="gpu-node-9"))
    assert not caught.value.retryable and "gpu-node-9" in str(caught.value)


async def test_an_unreachable_api_server_is_a_retryable_error(double):
    backend = _backend(double, SETTINGS.model_copy(update={"request_timeout_s": 2}))
    double.stop()
    with pytest.raises(BackendError) as caught:
        await backend.capacity()
    assert caught.value.retryable


def test_api_errors_name_the_call_and_say_whether_to_retry():
    forbidden = ApiException(status=403, reason="Forbidden")
    forbidden.body = json.dumps({"kind": "Status", "message": "secrets is forbidden"})
    error = _api_error("create Secret x", forbidden)
    assert str(error) == "create Secret x: HTTP 403 secrets is forbidden"
    assert not error.retryable
    assert _api_error("list nodes", ApiException(status=503, reason="Unavailable")).retryable


NADS = ("k8s.cni.cncf.io/v1", "network-attachment-definitions")
PODS = ("v1", "pods")
ISOLATED = SETTINGS.model_copy(update={"wireguard_endpoint": "gw.example.net"})
SEED = b"\x07" * 32


def _isolated_backend(double, settings=ISOLATED):
    def factory():
        configuration = client.Configuration()
        configuration.host = double.url
        return client.ApiClient(configuration)

    return KubevirtBackend(settings, factory, gateway_seed=SEED)


async def test_an_isolated_job_gets_a_vlan_of_its_own_and_a_gateway_its_members_reach(
        double, nursery):
    import base64

    from nodes.k8s_worker.kubevirt.gateway import gateway_keys, isolated_names
    from p2p.keys import KeyPair
    from runtime.wireguard import gateway_script, parse_config, wg_public_key_of

    from .units import isolated_unit

    backend = _isolated_backend(double)
    assert (await backend.capacity()).isolated_networks
    send, events = trio.open_memory_channel(100)
    await nursery.start(backend.run, send)
    ada, bob, cy = (KeyPair.generate().public_key for _ in range(3))
    unit = isolated_unit(members=(ada, bob))
    network, gateway = isolated_names(unit.job_id)

    await backend.create(unit)
    nad = double.get(*NADS, NS, network)
    config = json.loads(nad["spec"]["config"])
    assert (config["type"], config["bridge"], config["vlan"]) == ("ovs", "br-overlay", 2000)
    assert config["ipam"]["exclude"] == ["10.88.0.1/32"]  # the gateway's
    peers = parse_config(base64.b64decode(
        double.get(*SECRETS, NS, gateway)["data"]["wg0.conf"]).decode())[1:]
    assert sorted(p["PublicKey"] for _, p in peers) == sorted(
        wg_public_key_of(k) for k in (ada, bob))
    pod = double.get(*PODS, NS, gateway)
    (container,) = pod["spec"]["containers"]
    assert container["command"] == gateway_script(
        "wg0", "/etc/cosmicac-wireguard/wg0.conf", "10.250.0.1/24",
        also=[("net1", "10.88.0.1/24")])
    assert json.loads(pod["metadata"]["annotations"]["k8s.v1.cni.cncf.io/networks"]) == [
        {"name": network, "namespace": NS, "interface": "net1"}]
    service = double.get(*SERVICES, NS, gateway)
    assert service["spec"]["ports"][0]["protocol"] == "UDP"
    vmi = double.get(*VMIS, NS, unit.vmis[0].name)
    for server_field in ("uid", "resourceVersion", "creationTimestamp"):
        del vmi["metadata"][server_field]
    validate(vmi)
    assert {"name": "isolated", "multus": {"networkName": f"{NS}/{network}"}} in \
        vmi["spec"]["networks"]
    # The gateway, as the worker reports it to members.
    with trio.fail_after(LIMIT_S):
        async for event in events:
            if event.gateway is not None:
                break
    assert event.name == unit.vmis[0].name
    assert event.gateway.endpoint == f"gw.example.net:{service['spec']['ports'][0]['nodePort']}"
    assert event.gateway.public_key == gateway_keys(SEED, unit.job_id)[1]
    assert event.gateway.networks == ("10.88.0.0/24",)

    # Another job takes the next VLAN; the first one created again keeps its own.
    other = isolated_unit("j-0011223344556677", members=(ada,))
    await backend.create(other)
    assert json.loads(double.get(*NADS, NS, isolated_names(other.job_id)[0])["spec"]
                      ["config"])["vlan"] == 2001
    await backend.create(unit)
    assert json.loads(double.get(*NADS, NS, network)["spec"]["config"])["vlan"] == 2000

    # The team changes: the gateway's file names the new members only.
    await backend.set_gateway_peers(unit.job_id, [cy])
    peers = parse_config(base64.b64decode(
        double.get(*SECRETS, NS, gateway)["data"]["wg0.conf"]).decode())[1:]
    assert [p["PublicKey"] for _, p in peers] == [wg_public_key_of(cy)]

    await backend.delete(unit)
    for kind in (NADS, PODS, SERVICES, SECRETS):
        assert double.get(*kind, NS, gateway if kind != NADS else network) is None
    third = isolated_unit("j-aabbccddeeff0011", members=(ada,))
    await backend.create(third)  # the freed VLAN is taken again
    assert json.loads(double.get(*NADS, NS, isolated_names(third.job_id)[0])["spec"]
                      ["config"])["vlan"] == 2000
    await backend.delete(other)
    await backend.delete(third)


async def test_without_a_wireguard_endpoint_an_isolated_job_is_refused_for_good(double):
    from .units import isolated_unit

    backend = _isolated_backend(double, SETTINGS)
    assert not (await backend.capacity()).isolated_networks
    with pytest.raises(BackendError, match="wireguard_endpoint") as caught:
        await backend.create(isolated_unit())
    assert not caught.value.retryable
    assert double.names(*VMIS, NS) == []  # nothing half made
