"""The reconciler's watch-fed view (cache.py), pure: kopf indices are played by plain mappings."""

from __future__ import annotations

from vllm_operator import api, builders
from vllm_operator.informers import cache


def child(kind: str, name: str, server: str = "srv", uid: str = "u1", rv: int = 10, **extra) -> dict:
    return {
        "apiVersion": "v1", "kind": kind,
        "metadata": {"name": name, "namespace": "ns", "uid": f"{kind}-{name}-{rv}", "resourceVersion": str(rv),
                     "labels": {builders.SERVER_LABEL: server},
                     "ownerReferences": [{"uid": uid, "controller": True, "kind": api.KIND}],
                     "managedFields": [{"manager": "x", "fieldsV1": {"f:spec": {"f:replicas": {}, "f:template": {}}}},
                                       {"manager": "y", "fieldsV1": {"f:metadata": {}}}],
                     "annotations": {"vllm-operator.io/desired-hash": "h",
                                     "kubectl.kubernetes.io/last-applied-configuration": "{...}"}},
        "spec": {"replicas": 1}, **extra,
    }


class FakeIndex(dict):
    """kopf's Index: key -> Store (a collection of values)."""

    def put(self, key, value):
        self.setdefault(key, []).append(value)


def objects_with(*children, servers=(), pods=()) -> tuple[cache.WatchedObjects, FakeIndex]:
    idx_children, idx_servers, idx_pods = FakeIndex(), FakeIndex(), FakeIndex()
    for c in children:
        for key, value in cache.index_child(c).items():
            idx_children.put(key, value)
    for s in servers:
        for key, value in cache.index_server(s).items():
            idx_servers.put(key, value)
    for p in pods:
        for key, value in cache.index_pod(p).items():
            idx_pods.put(key, value)
    objects = cache.WatchedObjects(clock=lambda: 0.0)
    objects.bind({cache.SERVERS_INDEX: idx_servers, cache.CHILDREN_INDEX: idx_children,
                  cache.PODS_INDEX: idx_pods, "other": object()})
    return objects, idx_children


def test_not_ready_until_bound_to_kopfs_indices():
    objects = cache.WatchedObjects()
    assert not objects.ready
    objects.bind({"logger": None})
    assert not objects.ready


def test_slim_keeps_what_a_reconcile_reads_and_drops_the_rest():
    s = cache.slim(child("StatefulSet", "srv"))
    assert s["metadata"]["annotations"] == {"vllm-operator.io/desired-hash": "h"}
    assert s["metadata"]["managedFields"] == [{"manager": "x", "fieldsV1": {"f:spec": {"f:replicas": {}}}}]
    assert s["spec"] == {"replicas": 1} and s["metadata"]["ownerReferences"][0]["uid"] == "u1"
    assert cache.unpack(cache.pack(s)) == s


def test_children_are_the_servers_own_by_controller_uid():
    objects, _ = objects_with(child("Service", "srv"), child("StatefulSet", "srv"),
                              child("Service", "srv-old", uid="old-uid"), child("Service", "other", server="other"))
    assert sorted(objects.children("ns", "srv", "u1")) == [("Service", "srv"), ("StatefulSet", "srv")]


def test_an_own_write_stands_in_until_the_watch_catches_up():
    objects, idx = objects_with(child("StatefulSet", "srv", rv=10))
    newer = child("StatefulSet", "srv", rv=12)
    newer["metadata"]["uid"] = "StatefulSet-srv-10"  # the same object, written by us
    newer["spec"] = {"replicas": 3}
    objects.remember(newer)
    assert objects.children("ns", "srv", "u1")[("StatefulSet", "srv")]["spec"] == {"replicas": 3}
    assert objects.overlay_size() == 1
    idx[("ns", "srv")] = [cache.pack(cache.slim(newer))]  # the watch delivers it
    assert objects.children("ns", "srv", "u1")[("StatefulSet", "srv")]["spec"] == {"replicas": 3}
    assert objects.overlay_size() == 0


def test_a_created_child_is_seen_before_its_watch_event():
    objects, _ = objects_with()
    objects.remember(child("Service", "srv", rv=5))
    assert list(objects.children("ns", "srv", "u1")) == [("Service", "srv")]


def test_the_watch_delivering_our_own_write_is_recognised_as_its_echo():
    objects, _ = objects_with()
    written = child("StatefulSet", "srv", rv=12)
    objects.remember(written)
    assert objects.echoes_own_write(written)
    later = child("StatefulSet", "srv", rv=13)  # the controller wrote its status since
    later["metadata"]["uid"] = written["metadata"]["uid"]
    assert not objects.echoes_own_write(later)
    recreated = child("StatefulSet", "srv", rv=12)
    recreated["metadata"]["uid"] = "someone-else"
    assert not objects.echoes_own_write(recreated)
    assert not objects.echoes_own_write(child("Service", "srv", rv=12))  # never written by us


def test_forget_and_expiry_drop_the_overlay():
    objects, _ = objects_with()
    svc = child("Service", "srv", rv=5)
    objects.remember(svc)
    objects.forget(svc)
    assert objects.children("ns", "srv", "u1") == {}
    objects.remember(svc)
    objects.clock = lambda: cache.OVERLAY_SECONDS + 1
    assert objects.children("ns", "srv", "u1") == {}
    assert objects.overlay_size() == 0


def test_a_recreated_object_wins_over_an_older_write():
    objects, idx = objects_with()
    objects.remember(child("Service", "srv", rv=50))
    recreated = child("Service", "srv", rv=20)
    recreated["metadata"]["uid"] = "new-uid"
    idx.put(("ns", "srv"), cache.pack(cache.slim(recreated)))
    assert objects.children("ns", "srv", "u1")[("Service", "srv")]["metadata"]["uid"] == "new-uid"


def test_server_status_writes_are_remembered_too():
    server = {"apiVersion": api.API_VERSION, "kind": api.KIND,
              "metadata": {"name": "srv", "namespace": "ns", "uid": "u1", "resourceVersion": "7", "generation": 1},
              "spec": {"model": {"name": "m"}}}
    objects, _ = objects_with(servers=[server])
    assert objects.server("ns", "srv")["metadata"]["resourceVersion"] == "7"
    written = {**server, "metadata": {**server["metadata"], "resourceVersion": "9"}, "status": {"observedGeneration": 1}}
    objects.remember(written)
    assert objects.server("ns", "srv")["status"] == {"observedGeneration": 1}
    assert objects.server("ns", "gone") is None


def test_pods_keep_what_the_reconciler_and_the_autoscaler_read():
    pod = {"metadata": {"name": "srv-0", "namespace": "ns", "uid": "p", "labels": {"app.kubernetes.io/instance": "srv"},
                        "creationTimestamp": "2026-01-01T00:00:00Z", "managedFields": [{"manager": "kubelet"}]},
           "spec": {"containers": [{"name": "vllm", "args": ["m", "--max-num-seqs", "8"], "image": "x",
                                    "ports": [{"name": "http", "containerPort": 8000}], "env": [{"name": "A"}],
                                    "resources": {"limits": {"memory": "20Gi", "nvidia.com/gpu": "1"},
                                                  "requests": {"cpu": "4"}},
                                    "startupProbe": {"periodSeconds": 10}}], "volumes": [{"name": "cache"}]},
           "status": {"phase": "Running", "podIP": "10.0.0.5", "conditions": [{"type": "Ready", "status": "True"}],
                      "containerStatuses": [{"name": "vllm", "restartCount": 3, "image": "x", "ready": True,
                                             "state": {"waiting": {"reason": "CrashLoopBackOff"}}}]}}
    objects, _ = objects_with(pods=[pod])
    [kept] = objects.pods("ns", "srv")
    assert kept == {
        "metadata": {"name": "srv-0", "namespace": "ns", "uid": "p", "creationTimestamp": "2026-01-01T00:00:00Z"},
        "spec": {"containers": [{"name": "vllm", "image": "x", "args": ["m", "--max-num-seqs", "8"],
                                 "ports": [{"name": "http", "containerPort": 8000}],
                                 "startupProbe": {"periodSeconds": 10},
                                 "resources": {"limits": {"memory": "20Gi"}}}]},
        "status": {"phase": "Running", "podIP": "10.0.0.5", "conditions": [{"type": "Ready", "status": "True"}],
                   "containerStatuses": [{"name": "vllm", "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                                          "restartCount": 3, "ready": True}]}}


def test_expired_writes_of_servers_never_read_again_are_swept():
    now = [0.0]
    objects = cache.WatchedObjects(clock=lambda: now[0])
    objects.remember(child("Service", "gone", server="gone"))
    now[0] = cache.OVERLAY_SECONDS + 1
    for i in range(256):
        objects.remember(child("Service", f"s{i}", server=f"s{i}"))
    assert objects.overlay_size() == 256  # "gone" swept without ever being read


def test_managed_fields_are_dropped_from_the_body_kopf_keeps_after_indexing():
    import kopf

    raw = {"apiVersion": api.API_VERSION, "kind": api.KIND,
           "metadata": {"name": "srv", "namespace": "ns", "uid": "u1", "resourceVersion": "7",
                        "managedFields": [{"manager": "kubectl", "fieldsV1": {"f:spec": {"f:model": {}}}}]},
           "spec": {"model": {"name": "m"}}}
    body = kopf.Body(raw)
    entry = cache.index_server(body)
    cache.drop_managed_fields(body)
    assert "managedFields" not in raw["metadata"] and raw["spec"] == {"model": {"name": "m"}}
    assert cache.unpack(entry[("ns", "srv")])["metadata"]["name"] == "srv"


# ---- re-listings and audits: kopf never tells an index what vanished while its watch was down
def test_a_version_delivered_again_marks_the_index_for_an_audit_once_quiet():
    now = [0.0]
    objects = cache.WatchedObjects(clock=lambda: now[0])
    sts = child("StatefulSet", "srv", rv=10)
    objects.note_indexed(cache.CHILDREN_INDEX, sts)  # first sight (the start-up listing): nothing due
    newer = {**sts, "metadata": {**sts["metadata"], "resourceVersion": "11"}}
    objects.note_indexed(cache.CHILDREN_INDEX, newer)  # a newer version: a normal watch event
    assert objects.audits_due() == []
    now[0] = 100.0
    objects.note_indexed(cache.CHILDREN_INDEX, newer)  # the same version again: a re-listing
    assert objects.audits_due() == [], "a re-listing arrives in a burst: wait until it is quiet"
    now[0] = 100.0 + cache.AUDIT_QUIET_SECONDS
    assert objects.audits_due() == [cache.CHILDREN_INDEX]
    assert objects.audits_due() == [], "once per re-listing"


def test_an_audit_hides_what_a_list_lacks_and_keeps_what_is_newer_than_the_list():
    gone = child("StatefulSet", "srv", rv=10)
    svc = child("Service", "srv", rv=11)
    created_after_the_list = child("Service", "srv-headless", rv=30)
    objects, _ = objects_with(gone, svc, created_after_the_list)
    assert set(objects.children("ns", "srv", "u1")) == {("StatefulSet", "srv"), ("Service", "srv"),
                                                        ("Service", "srv-headless")}
    # the StatefulSets LIST (at resourceVersion 20) lacks it: deleted while the watch was down
    found = objects.audit(cache.CHILDREN_INDEX, [cache.Listing([], 20, "StatefulSet", "ns")])
    assert [o["metadata"]["name"] for o in found] == ["srv"]
    # the Services LIST has one of them; the other is newer than the LIST, so it is not judged by it
    assert objects.audit(cache.CHILDREN_INDEX, [cache.Listing([svc], 20, "Service", "ns")]) == []
    assert objects.audit(cache.CHILDREN_INDEX, [cache.Listing([], 20, "StatefulSet", "other")]) == []
    assert set(objects.children("ns", "srv", "u1")) == {("Service", "srv"), ("Service", "srv-headless")}


def test_servers_and_pods_deleted_unseen_are_no_longer_read():
    server = {"apiVersion": f"{api.GROUP}/{api.VERSION}", "kind": api.KIND,
              "metadata": {"name": "srv", "namespace": "ns", "uid": "u1", "resourceVersion": "5"}, "spec": {}}
    pod = {"metadata": {"name": "srv-0", "namespace": "ns", "uid": "p1", "resourceVersion": "6",
                        "labels": {"app.kubernetes.io/instance": "srv"}}, "spec": {}, "status": {}}
    objects, _ = objects_with(servers=[server], pods=[pod])
    assert objects.server("ns", "srv") and objects.pods("ns", "srv")
    assert objects.audit(cache.SERVERS_INDEX, [cache.Listing([server], 9)]) == []
    assert objects.audit(cache.PODS_INDEX, [cache.Listing([], 9)]) != []
    assert objects.pods("ns", "srv") == [] and objects.server("ns", "srv")
    assert objects.audit(cache.SERVERS_INDEX, [cache.Listing([], 9)]) != []
    assert objects.server("ns", "srv") is None


def test_an_audit_forgets_what_kopf_discarded():
    sts = child("StatefulSet", "srv", rv=10)
    objects, idx = objects_with(sts)
    objects.note_indexed(cache.CHILDREN_INDEX, sts)
    objects.audit(cache.CHILDREN_INDEX, [cache.Listing([], 20, "StatefulSet")])
    assert objects.children("ns", "srv", "u1") == {}
    idx.clear()  # kopf discarded it (its DELETED event came after all)
    assert objects.audit(cache.CHILDREN_INDEX, []) == []  # no LIST judges anything; the pass still trims
    assert objects._seen[cache.CHILDREN_INDEX] == {} and objects._gone[cache.CHILDREN_INDEX] == frozenset()


def test_slim_copies_kopf_views_into_plain_dicts_and_lists():
    """What the copies keep is plain data of its own: kopf's views (Body, Spec) become dicts, tuples lists; the
    leaves (str subclasses, numbers, booleans, None) are kept as they are."""
    import kopf

    class Name(str):
        pass

    raw = {"apiVersion": "apps/v1", "kind": "StatefulSet",
           "metadata": {"name": Name("s"), "namespace": "ns", "uid": "u", "labels": {"a": "b"}},
           "spec": {"replicas": 2, "ratio": 0.5, "paused": False, "none": None, "ports": ({"port": 80},),
                    "template": {"spec": {"containers": [{"name": "c", "args": ["--x", "1"]}]}}},
           "status": {"readyReplicas": 1}}
    out = cache.slim(kopf.Body(raw))
    assert out == {**raw, "spec": {**raw["spec"], "ports": [{"port": 80}]}}
    assert type(out["spec"]) is dict and type(out["spec"]["ports"]) is list
    assert out["spec"]["template"] is not raw["spec"]["template"]  # a copy: kopf may change its body later
    assert out["metadata"]["name"] == "s" and isinstance(out["metadata"]["name"], Name)
