"""The read interface (informers/reader.py) and its two implementations, pure: the watch-fed copies
(cache.WatchedObjects over plain mappings standing in for kopf's indices) and the direct reader (over the
in-memory API of e2e/testbed/memory_world.py). The same scenarios run on both; a copy that cannot be read
raises, and the reconcile is retried instead of reading the server as gone."""

from __future__ import annotations

import asyncio
import copy
import logging

import kopf
import pytest

from e2e.testbed.memory_world import NS, MemoryKube, World
from tests.unit.test_cache import FakeIndex, child
from vllm_operator import api, builders, operator_main
from vllm_operator import telemetry
from vllm_operator.kube.client import ApiError
from vllm_operator.controller.reconcile import Reconciler
from vllm_operator.informers import cache
from vllm_operator.informers.reader import DirectReader, NotSynced, ReadFailed, Reader

KINDS = [("v1", "Service"), ("apps/v1", "StatefulSet"), ("policy/v1", "PodDisruptionBudget")]


def server(name: str = "srv", rv: int = 7) -> dict:
    return {"apiVersion": api.API_VERSION, "kind": api.KIND,
            "metadata": {"name": name, "namespace": "ns", "uid": "u1", "resourceVersion": str(rv), "generation": 1},
            "spec": {"model": {"name": "m"}}}


def pod(name: str, instance: str = "srv") -> dict:
    return {"metadata": {"name": name, "namespace": "ns", "uid": f"pod-{name}", "resourceVersion": "3",
                         "labels": {"app.kubernetes.io/name": "vllm", "app.kubernetes.io/instance": instance}},
            "spec": {"containers": [{"name": "vllm"}]}, "status": {"phase": "Pending"}}


#: The cluster both readers look at: a server, two of its children, a child of another server by uid (an older
#: server of the same name), another server's Service, and one pod each.
CLUSTER = {
    "servers": [server()],
    "children": [child("Service", "srv"), child("StatefulSet", "srv"), child("Service", "srv-old", uid="old-uid"),
                 child("Service", "other", server="other")],
    "pods": [pod("srv-0"), pod("other-0", instance="other")],
}


def watched(cluster: dict) -> cache.WatchedObjects:
    indices = {cache.SERVERS_INDEX: FakeIndex(), cache.CHILDREN_INDEX: FakeIndex(), cache.PODS_INDEX: FakeIndex()}
    for key, index, fn in (("servers", cache.SERVERS_INDEX, cache.index_server),
                           ("children", cache.CHILDREN_INDEX, cache.index_child),
                           ("pods", cache.PODS_INDEX, cache.index_pod)):
        for obj in cluster[key]:
            for k, v in fn(obj).items():
                indices[index].put(k, v)
    objects = cache.WatchedObjects(clock=lambda: 0.0)
    objects.bind(indices)
    return objects


def direct(cluster: dict) -> DirectReader:
    kube = MemoryKube()
    for obj in cluster["servers"] + cluster["children"]:
        kube.objects[(obj["kind"], obj["metadata"]["namespace"], obj["metadata"]["name"])] = copy.deepcopy(obj)
    for obj in cluster["pods"]:
        kube.objects[("Pod", obj["metadata"]["namespace"], obj["metadata"]["name"])] = copy.deepcopy(obj)
    return DirectReader(kube, KINDS)


READERS = {"watched": watched, "direct": direct}


@pytest.fixture(params=sorted(READERS))
def reader(request) -> Reader:
    return READERS[request.param](CLUSTER)


# ---- the same answers from both
def test_the_server_and_none_for_one_that_does_not_exist(reader):
    assert reader.server("ns", "srv")["metadata"]["uid"] == "u1"
    assert reader.server("ns", "absent") is None


def test_children_are_the_servers_own_by_controller_uid(reader):
    assert sorted(reader.children("ns", "srv", "u1")) == [("Service", "srv"), ("StatefulSet", "srv")]
    assert sorted(reader.children("ns", "srv", "u1", kinds=[("apps/v1", "StatefulSet")])) == [("StatefulSet", "srv")]
    assert reader.children("ns", "absent", "u9") == {}


def test_pods_of_the_server(reader):
    assert [p["metadata"]["name"] for p in reader.pods("ns", "srv")] == ["srv-0"]
    assert reader.pods("ns", "absent") == []


def test_an_own_write_is_read_back_at_once(reader):
    """Read-your-writes: the answer of our apply is what the next read sees, before any watch event."""
    written = child("StatefulSet", "srv", rv=12)
    written["metadata"]["uid"] = "StatefulSet-srv-10"  # the same object
    written["spec"] = {"replicas": 3}
    if isinstance(reader, DirectReader):  # the API server has it: the write happened there
        reader.kube.objects[("StatefulSet", "ns", "srv")] = copy.deepcopy(written)
    reader.remember(written)
    assert reader.children("ns", "srv", "u1")[("StatefulSet", "srv")]["spec"] == {"replicas": 3}
    status = {**server(rv=9), "status": {"observedGeneration": 1}}
    if isinstance(reader, DirectReader):
        reader.kube.objects[(api.KIND, "ns", "srv")] = copy.deepcopy(status)
    reader.remember(status)
    assert reader.server("ns", "srv")["status"] == {"observedGeneration": 1}


# ---- what each does when it cannot answer
READS = {"server": lambda r: r.server("ns", "srv"), "children": lambda r: r.children("ns", "srv", "u1"),
         "pods": lambda r: r.pods("ns", "srv")}


@pytest.mark.parametrize("what", sorted(READS))
def test_the_watch_fed_copy_raises_until_kopf_hands_over_its_indices(what):
    objects = cache.WatchedObjects()
    with pytest.raises(NotSynced):
        READS[what](objects)
    objects.bind({cache.SERVERS_INDEX: FakeIndex(), cache.CHILDREN_INDEX: FakeIndex()})  # no pods index
    assert objects.ready
    if what == "pods":
        with pytest.raises(NotSynced):  # an index kopf did not hand over is not an empty one
            READS[what](objects)
    else:
        assert not READS[what](objects)  # the indices handed over answer: nothing there


class Changing(dict):
    """An index entry kopf keeps resizing: every copy of it fails as a live dict's would."""

    def __iter__(self):
        raise RuntimeError("dictionary changed size during iteration")


class Resizing(dict):
    """An index whose lookups keep failing the same way."""

    def get(self, key, default=None):
        raise RuntimeError("dictionary changed size during iteration")


@pytest.mark.parametrize("index", [FakeIndex({("ns", "srv"): Changing(a=1)}), Resizing()], ids=["entry", "index"])
def test_a_copy_that_cannot_be_taken_raises_instead_of_reading_empty(index):
    objects = cache.WatchedObjects()
    objects.bind({cache.SERVERS_INDEX: index, cache.CHILDREN_INDEX: index, cache.PODS_INDEX: index})
    for read in READS.values():
        with pytest.raises(ReadFailed):
            read(objects)


def test_the_direct_reader_skips_a_kind_the_cluster_does_not_serve_and_raises_other_errors():
    class Kube(MemoryKube):
        def __init__(self, status: int):
            super().__init__()
            self.status = status

        def list(self, api_version, kind, namespace, *, label_selector=None):
            if kind == "ScaledObject":
                raise ApiError(self.status, "no", "GET", "/apis/keda.sh")
            return super().list(api_version, kind, namespace, label_selector=label_selector)

    kinds = [("v1", "Service"), ("keda.sh/v1alpha1", "ScaledObject")]
    kube = Kube(404)
    kube.objects[("Service", "ns", "srv")] = child("Service", "srv")
    assert list(DirectReader(kube, kinds).children("ns", "srv", "u1")) == [("Service", "srv")]
    with pytest.raises(ApiError):
        DirectReader(Kube(500), kinds).children("ns", "srv", "u1")


# ---- the reconcile: a failed read is retried, never read as "the server is gone"
class Failing:
    """A reader whose copy cannot be read."""

    def server(self, *args, **kwargs):
        raise ReadFailed("the copy changed during 5 attempts at reading it")

    children = pods = server

    def remember(self, obj):
        raise AssertionError("nothing was written")

    forget = remember


def test_a_reconcile_that_cannot_read_raises_and_writes_nothing():
    world = World()
    world.reconcile()
    before, events = copy.deepcopy(world.kube.objects), len(world.kube.events)
    world.reconciler.reader = Failing()
    with pytest.raises(ReadFailed):
        world.reconciler.reconcile(NS, "srv")
    assert world.kube.objects == before and len(world.kube.events) == events


def test_the_operator_retries_a_reconcile_that_cannot_read_and_keeps_the_servers_gauges():
    world = World({"replicas": 2})
    op = operator_main.Operator(world.reconciler)
    log = logging.getLogger("test")
    labels = {"namespace": NS, "name": "srv"}
    op.reconcile(NS, "srv", log)
    assert telemetry.REGISTRY.get_sample_value("vllm_operator_server_replicas", labels) == 2
    errors = telemetry.REGISTRY.get_sample_value("vllm_operator_reconcile_errors_total", {"cause": "ReadFailed"}) or 0
    world.reconciler.reader = Failing()
    with pytest.raises(kopf.TemporaryError) as raised:
        op.reconcile(NS, "srv", log)
    assert raised.value.delay == 3 and "could not be read" in str(raised.value)
    assert telemetry.REGISTRY.get_sample_value("vllm_operator_server_replicas", labels) == 2, "not forgotten as gone"
    assert telemetry.REGISTRY.get_sample_value("vllm_operator_reconcile_errors_total",
                                             {"cause": "ReadFailed"}) == errors + 1
    telemetry.forget_server(NS, "srv")


def test_a_reconciler_built_by_hand_reads_the_api_server():
    kube = MemoryKube()
    reconciler = Reconciler(kube)  # type: ignore[arg-type]
    assert isinstance(reconciler.reader, DirectReader) and reconciler.reader.kinds == reconciler.managed_kinds()
    assert reconciler.reconcile(NS, "absent") is None


def test_the_operator_reads_what_its_handlers_were_given():
    """kopf passes its indices to every handler; the first handler's kwargs make the copies readable."""
    op = operator_main.Operator(World().reconciler)
    with pytest.raises(NotSynced):
        op.objects.server("ns", "srv")
    indices = {cache.SERVERS_INDEX: FakeIndex(), cache.CHILDREN_INDEX: FakeIndex(), cache.PODS_INDEX: FakeIndex()}
    for k, v in cache.index_server(server()).items():
        indices[cache.SERVERS_INDEX].put(k, v)
    svc = child("Service", "srv")
    svc["metadata"]["labels"][builders.SERVER_LABEL] = "srv"
    svc["metadata"]["ownerReferences"][0]["kind"] = api.KIND
    op.reconciler.reader = Failing()  # what the child event would reconcile is not the point here
    with pytest.raises(kopf.TemporaryError):
        asyncio.run(op.on_child(svc, {"type": "MODIFIED"}, logging.getLogger("test"), **indices))
    assert op.objects.server("ns", "srv")["metadata"]["uid"] == "u1"


def test_a_childs_echo_ends_on_the_event_loop_and_a_change_is_reconciled_on_kopfs_threads():
    """on_child decides on kopf's event loop: the echo of the operator's own apply needs no thread (kopf's queue of
    sync handler calls was the RSS peak at 1,000 servers); a change is reconciled on kopf's executor."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    op = operator_main.Operator(World().reconciler)
    ran: list[tuple[str, str, str]] = []
    op.reconcile = lambda namespace, name, logger, retry=0: ran.append(  # type: ignore[method-assign]
        (namespace, name, threading.current_thread().name))
    op.executor = ThreadPoolExecutor(1, thread_name_prefix="kopf-handlers")
    svc = child("Service", "srv", rv=10)
    op.objects.remember(svc)  # the answer to our own apply
    asyncio.run(op.on_child(svc, {"type": "ADDED"}, logging.getLogger("test")))
    assert ran == []
    changed = copy.deepcopy(svc)
    changed["metadata"]["resourceVersion"] = "11"  # the controller wrote to it since
    asyncio.run(op.on_child(changed, {"type": "MODIFIED"}, logging.getLogger("test")))
    assert [(ns, name) for ns, name, _ in ran] == [("ns", "srv")]
    assert ran[0][2].startswith("kopf-handlers")
    foreign = child("Service", "other", server="")  # no server label: not ours
    asyncio.run(op.on_child(foreign, {"type": "MODIFIED"}, logging.getLogger("test")))
    assert len(ran) == 1
    op.executor.shutdown()


# ---- every handler on one registry, none at import
def handler_ids(registry: kopf.OperatorRegistry) -> dict[str, list[str]]:
    """The handler ids on a registry by what they do (kopf's registries have no public listing of them)."""
    parts = {"activities": registry._activities, "indexing": registry._indexing, "watching": registry._watching,
             "spawning": registry._spawning, "changing": registry._changing}
    return {k: sorted(str(h.id) for h in part.get_all_handlers()) for k, part in parts.items()}


def test_importing_the_operator_registers_nothing_and_one_function_registers_everything():
    default = handler_ids(kopf.get_default_registry())
    assert not any("on_change" in i or "on_timer" in i or "autoscaler" in i or i == "configure"
                   for ids in default.values() for i in ids), default
    op = operator_main.Operator(World().reconciler)
    op.scaling = object()  # type: ignore[assignment] - only its presence matters to the registration
    registry = kopf.OperatorRegistry()
    operator_main.register_handlers(registry, op, resync_seconds=30)
    ids = handler_ids(registry)
    assert ids["changing"] == ["on_change", "on_change", "on_change"]  # resume, create, update
    assert ids["spawning"] == ["autoscaler", "on_timer"]  # kopf keeps timers with daemons
    assert ids["watching"] == ["on_child/daemonsets", "on_child/services", "on_child/statefulsets"]
    assert set(ids["indexing"]) == {cache.SERVERS_INDEX, cache.CHILDREN_INDEX, cache.PODS_INDEX}
    assert len(ids["indexing"]) == 2 + len(op.reconciler.managed_kinds())
    assert {"configure", "watch_event_loop"} <= set(ids["activities"])
    assert handler_ids(kopf.get_default_registry()) == default


def test_an_autoscaler_tick_that_cannot_read_raises_and_reports_nothing():
    """Before, an empty copy read as "the StatefulSet does not exist yet" and wrote that into the status."""
    import json

    import yaml

    from tests.unit.test_autoscaler_actuator import ROOT, FakeKube
    from vllm_operator.autoscaler import actuator

    body = yaml.safe_load((ROOT / "examples" / "llama-3b-autoscaled.yaml").read_text())
    body["metadata"] = {"name": "s", "namespace": "ns", "uid": "u1", "generation": 1, "resourceVersion": "5"}
    kube = FakeKube(body)
    scaler = actuator.Autoscaler(kube, actuator.Sources(), "ns", "s", clock=lambda: 1000.0, reader=Failing())
    with pytest.raises(ReadFailed):
        scaler.tick(json.loads(json.dumps(body)))
    assert kube.status_applies == 0
