"""The status a reconcile reports, built from plain data without a Reconciler (server_status.py): an invalid spec,
a rollout, ready replicas, a server scaled to zero, a LeaderWorkerSet's groups, the adapters."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml

from vllm_operator import adapters, api, pipeline, server_status
from vllm_operator.conditions import Conditions, condition

ROOT = Path(__file__).resolve().parents[2]
NOW = "2026-01-01T00:00:00Z"


def spec(example: str = "llama-8b-single-gpu.yaml", **changes) -> api.VLLMServerSpec:
    doc = yaml.safe_load((ROOT / "examples" / example).read_text())
    return api.VLLMServerSpec.model_validate({**doc["spec"], **changes})


def statefulset(replicas: int, ready: int, updated: int | None = None, generation: int = 1) -> dict:
    updated = replicas if updated is None else updated
    return {"kind": "StatefulSet", "metadata": {"name": "srv", "generation": generation},
            "spec": {"replicas": replicas, "template": {"spec": {}}},
            "status": {"observedGeneration": generation, "replicas": replicas, "readyReplicas": ready,
                       "updatedReplicas": updated, "currentRevision": "r1",
                       "updateRevision": "r1" if updated >= replicas else "r2"}}


def conditions(live: dict | None = None) -> Conditions:
    return Conditions((live or {}).get("conditions") or [], 3, NOW)


def by_type(c: Conditions) -> dict[str, tuple[str, str]]:
    return {x.type: (x.status, x.reason) for x in c.items}


@dataclass(frozen=True)
class Crash:
    reason: str = "CrashLoopBackOff"
    message: str = "pod srv-0: vllm exited 1"
    waiting: bool = False


def test_an_invalid_new_spec_says_why_everywhere_and_emits_one_event():
    c = conditions()
    status, events = server_status.invalid_spec(c, {}, ["spec.gpu.count: too small"], "InvalidSpec", None)
    assert by_type(c) == {"SpecValid": ("False", "InvalidSpec"), "Degraded": ("True", "InvalidSpec"),
                          "Ready": ("False", "InvalidSpec"), "Progressing": ("False", "InvalidSpec"),
                          "Stalled": ("True", "InvalidSpec")}
    assert "nothing has been deployed" in c.get("Degraded").message
    assert events == [("Warning", "InvalidSpec", "spec.gpu.count: too small")]
    assert (status.observed_generation, status.replicas, status.endpoint) == (3, 0, None)
    # The same verdict again: no new Event.
    again = {"conditions": [x.wire() for x in c.items]}
    assert server_status.invalid_spec(conditions(again), again, ["spec.gpu.count: too small"], "InvalidSpec",
                                      None)[1] == []


def test_an_invalid_change_keeps_what_the_last_valid_spec_serves():
    live = {"endpoint": "http://srv.team.svc:8000/v1", "selector": "a=b", "servedModels": ["m"]}
    status, _ = server_status.invalid_spec(conditions(), live, ["bad"], "PodSecurityForbidden",
                                           statefulset(2, 2))
    assert (status.endpoint, status.selector, status.served_models) == (live["endpoint"], "a=b", ["m"])
    assert (status.replicas, status.ready_replicas) == (2, 2)


def test_a_rollout_is_progressing_and_ready_counts_replicas():
    c = conditions()
    progress = server_status.workload_progress(statefulset(3, 1, updated=1))
    server_status.health_conditions(c, progress, statefulset(3, 1, updated=1), spec(), None, None)
    assert by_type(c) == {"Degraded": ("False", "AsExpected"), "Ready": ("False", "PartiallyReady"),
                          "Progressing": ("True", "RollingOut")}
    assert c.get("Progressing").message == "StatefulSet: 1/3 updated, 1/3 ready"
    server_status.kstatus_reconciling(c)
    assert c.get("Reconciling") is None, "Reconciling only while Ready is True"


def test_all_ready_and_a_report_with_its_transition_event():
    c = conditions()
    workload = statefulset(2, 2)
    progress = server_status.workload_progress(workload)
    server_status.health_conditions(c, progress, workload, spec(), None, None)
    plan = pipeline.plan_server("srv", "team", spec())
    status = server_status.deployed("srv", "team", c, progress, plan, live={})
    report = server_status.report(status, c, {"conditions": [{"type": "Ready", "status": "False"}]})
    assert report.ready and report.changed
    assert report.status["endpoint"] == "http://srv.team.svc:8000/v1"
    assert condition(report.status, "Ready")["reason"] == "AllReplicasReady"
    assert ("Normal", "Ready", "2/2 replicas ready") in report.events
    assert server_status.report(status, conditions({"conditions": report.status["conditions"]}),
                                report.status).changed is False


def test_a_failure_is_named_in_ready_degraded_and_stalled_and_announced_once():
    c = conditions()
    workload = statefulset(1, 0)
    server_status.health_conditions(c, server_status.workload_progress(workload), workload, spec(), Crash(), None)
    assert by_type(c)["Ready"] == ("False", "CrashLoopBackOff") and by_type(c)["Stalled"] == ("True",
                                                                                              "CrashLoopBackOff")
    wire = [x.wire() for x in c.items]
    events = server_status.transition_events({}, wire, {"CrashLoopBackOff"}, ())
    assert events == [("Warning", "CrashLoopBackOff", "pod srv-0: vllm exited 1")]
    assert server_status.transition_events({"conditions": wire}, wire, {"CrashLoopBackOff"}, ()) == []


def test_scaled_to_zero_by_the_autoscaler_is_ready_and_idle():
    idle = spec(autoscaling={"enabled": True, "minReplicas": 0, "maxReplicas": 2})
    c = conditions()
    workload = statefulset(0, 0)
    server_status.health_conditions(c, server_status.workload_progress(workload), workload, idle, None, None)
    ready = c.get("Ready")
    assert (ready.status, ready.reason) == ("True", "ScaledToZero") and ready.message.startswith("idle:")
    c = conditions()
    server_status.health_conditions(c, server_status.workload_progress(workload), workload, spec(replicas=0),
                                    None, None)
    assert c.get("Ready").message == "no replicas requested"


def test_a_leaderworkerset_counts_groups():
    lws = {"kind": "LeaderWorkerSet", "metadata": {"name": "srv", "generation": 2},
           "spec": {"replicas": 2, "leaderWorkerTemplate": {"leaderTemplate": {"spec": {"a": 1}},
                                                            "workerTemplate": {"spec": {"b": 2}}}},
           "status": {"observedGeneration": 2, "replicas": 2, "readyReplicas": 1, "updatedReplicas": 2}}
    progress = server_status.workload_progress(lws)
    assert progress == {"desired": 2, "ready": 1, "updated": 2, "settled": False}
    assert [t["spec"] for t in server_status.pod_templates(lws)] == [{"a": 1}, {"b": 2}]
    c = conditions()
    server_status.health_conditions(c, progress, lws, spec(), None, None)
    assert c.get("Ready").message == "1/2 groups ready"


def test_nothing_applied_blocks_ready_and_progressing_with_its_reason():
    c = conditions()
    server_status.health_conditions(c, server_status.workload_progress(None), None, spec(), None,
                                    ("NameConflict", "Service srv is taken"))
    assert by_type(c) == {"Degraded": ("True", "NameConflict"), "Stalled": ("True", "NameConflict"),
                          "Ready": ("False", "NameConflict"), "Progressing": ("False", "NameConflict")}
    wire = [x.wire() for x in c.items]
    assert server_status.transition_events({}, wire, (), {"NameConflict"}) == [
        ("Warning", "NameConflict", "Service srv is taken")]


def test_adapters_rows_condition_and_one_event_per_new_failure():
    with_adapters = spec(adapters=[{"name": "sql", "source": "org/sql-lora"}, {"name": "chat", "source": "org/c"}])
    known = [adapters.PodAdapters(pod="srv-0", listed=frozenset({"sql"}), errors={"chat": "HTTP 400"})]
    c = conditions()
    rows, served, events = server_status.adapter_status(c, with_adapters, known, {})
    assert [(r.name, r.loaded, r.replicas) for r in rows] == [("sql", 1, 1), ("chat", 0, 1)]
    assert served[1:] == ["sql"]
    assert c.get("AdaptersReady").status == "False"
    assert [e[1] for e in events] == ["AdapterLoadFailed"]
    live = {"adapters": [r.model_dump(by_alias=True, exclude_none=True) for r in rows]}
    assert server_status.adapter_status(conditions(), with_adapters, known, live)[2] == []


def test_plan_outdated_appears_with_an_event_and_goes():
    c = conditions()
    assert [e[1] for e in server_status.plan_outdated(c, "args: --max-num-seqs 8 -> 16")] == ["PlanOutdated"]
    assert server_status.plan_outdated(c, "args: --max-num-seqs 8 -> 16") == []
    server_status.plan_outdated(c, None)
    assert c.get("PlanOutdated") is None
