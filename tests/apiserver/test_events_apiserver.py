"""The operator's Events on the real API server (kube/events.py): one Event per reason per server, counted on,
whatever a tenant changes, across restarts; and the Events it reads about a server's pods, only theirs, paginated
and capped, whatever else the namespace holds (issue 18 (b))."""

from __future__ import annotations

from typing import Any

from vllm_operator.kube import events

BODY = {"metadata": {"name": "srv", "namespace": "", "uid": "11111111-2222-3333-4444-555555555555"}}


def server(namespace: str) -> dict[str, Any]:
    return {"metadata": {**BODY["metadata"], "namespace": namespace}}


def test_one_event_per_reason_counted_on_across_restarts_and_printable(kube, namespace):
    body = server(namespace)
    for i in range(40):  # a tenant changing a refused spec 40 times: 40 distinct messages
        events.post_event(kube, body, "Warning", "InvalidSpec", f"spec {i}: bad\n\x1b[2Jforged line", component="t",
                          stamp="2026-01-01T00:00:00Z")
    events._POSTED.clear()  # the operator restarted: its memory of the Events is gone
    events.post_event(kube, body, "Warning", "InvalidSpec", "after the restart", component="t",
                      stamp="2026-01-01T00:01:00Z")
    events.post_event(kube, body, "Normal", "Applied", "applied", component="t", stamp="2026-01-01T00:01:00Z")
    items = kube.list("v1", "Event", namespace)
    assert sorted(e["reason"] for e in items) == ["Applied", "InvalidSpec"]
    [invalid] = [e for e in items if e["reason"] == "InvalidSpec"]
    assert invalid["count"] == 41 and invalid["message"] == "after the restart"
    assert invalid["lastTimestamp"] == "2026-01-01T00:01:00Z" and invalid["firstTimestamp"] == "2026-01-01T00:00:00Z"
    events.post_event(kube, body, "Warning", "InvalidSpec", "x\ny\x1b[31mz" + "w" * 5000, component="t",
                      stamp="2026-01-01T00:02:00Z")
    [invalid] = [e for e in kube.list("v1", "Event", namespace) if e["reason"] == "InvalidSpec"]
    assert invalid["message"].startswith("x yz") and len(invalid["message"]) <= events.bounds.EVENT_MESSAGE_CHARS


class Counting:
    """The Kube client, counting the Events LISTs and the items they returned."""

    def __init__(self, kube):
        self.kube, self.lists, self.items = kube, 0, 0

    def request(self, method, path, **kwargs):
        answer = self.kube.request(method, path, **kwargs)
        if method == "GET" and path.endswith("/events"):
            self.lists += 1
            self.items += len(answer.get("items") or [])
        return answer


def event(namespace: str, kind: str, name: str, i: int, reason: str = "BackOff", type_: str = "Warning") -> dict:
    return {"metadata": {"name": f"{name}.{i:05d}", "namespace": namespace},
            "involvedObject": {"kind": kind, "name": name, "namespace": namespace},
            "type": type_, "reason": reason, "message": "m", "count": 1}


def test_the_events_read_are_the_servers_objects_only_paginated_and_capped(kube, namespace):
    post = lambda e: kube.request("POST", f"/api/v1/namespaces/{namespace}/events", body=e)  # noqa: E731
    for i in range(400):  # another server's flood in the same namespace
        post(event(namespace, "Pod", "other-0", i))
    for i in range(350):  # the server's own pod with more Events than a read takes
        post(event(namespace, "Pod", "srv-0", i))
    post(event(namespace, "StatefulSet", "srv", 0, reason="FailedCreate"))
    post(event(namespace, "Pod", "srv-1", 0, reason="Scheduled", type_="Normal"))  # not a failure's
    post(event(namespace, "Pod", "srv-1", 1, reason="Killing", type_="Normal"))
    counting = Counting(kube)
    reader = events.FailureEvents(counting)
    objects = [{"kind": "StatefulSet", "metadata": {"name": "srv"}},
               {"kind": "Pod", "metadata": {"name": "srv-0"}}, {"kind": "Pod", "metadata": {"name": "srv-1"}}]
    found = reader.of(namespace, objects)
    names = {e["involvedObject"]["name"] for e in found}
    assert names == {"srv", "srv-0", "srv-1"}
    assert {e["reason"] for e in found if e["involvedObject"]["name"] == "srv-1"} == {"Killing"}
    own = [e for e in found if e["involvedObject"]["name"] == "srv-0"]
    assert len(own) == events.PAGE * events.PAGES_PER_OBJECT  # capped: 300 of its 350
    assert counting.items <= events.PAGE * events.PAGES_PER_OBJECT * len(objects)  # never the other server's 400
    assert counting.lists == 1 + events.PAGES_PER_OBJECT + 1
    reader.of(namespace, objects)
    assert counting.lists == 5  # within the TTL: nothing read again
