"""Name why a server's pods do not serve: a pure classifier over pod status and Events.

`classify(pods, events)` returns the one failure to report, a `Failure` with a CamelCase
`reason` and a `message` for people, or None. It reads only what the cluster wrote: pod
status and spec, the scheduler's, the kubelet's and the workload controller's Events (as
dicts, the way the API returns them, core/v1 or events.k8s.io/v1). Messages quote the
cluster (a webhook's denial, vLLM's last log lines through FallbackToLogsOnError), so each
piece is cleaned to one line and bounded, and the whole message to MAX_MESSAGE.

Order of precedence: the first reason in this list that applies wins; within one reason, the
first pod by name. Each stage hides the later ones (a pod that is never created is never
scheduled, one never scheduled never pulls its image), and within a container the cause
comes before the symptom (the kubelet's CrashLoopBackOff is only its back-off after an OOM
kill, a startup probe's kill, or a crash):

1. FailedCreate: the StatefulSet/DaemonSet controller cannot create pods (ResourceQuota,
   Pod Security, an admission webhook); its latest Warning, unless a pod was created since.
2. Unschedulable: PodScheduled=False, reason Unschedulable, with the scheduler's message.
3. ImagePullBackOff: the kubelet cannot pull the image (its ErrImagePull or ImagePullBackOff).
4. InvalidImageName: the image reference does not parse.
5. CreateContainerConfigError / CreateContainerError: the kubelet cannot build the container
   (a missing Secret or key behind hfTokenSecretRef or an env valueFrom).
6. OOMKilled: the container's last termination; names its memory limit.
7. StartupProbeFailed: the kubelet killed the container because its startup probe ran out
   (the Killing event "failed startup probe", or an "Unhealthy: Startup probe failed" Event
   during the run that ended with a signal); names the probe's budget.
8. CrashLoopBackOff: the container exits with an error and has not been ready since; its
   last termination message (vLLM's last log lines) is quoted.

A container that is ready has nothing to report, whatever its history. An Unschedulable pod
is only *waiting* (never Degraded, and after every failure) while the cluster autoscaler
says it is adding a node (TriggeredScaleUp, Karpenter's Nominated) or for the first
UNSCHEDULABLE_GRACE_SECONDS: GPU nodes take minutes to join. Pods being deleted are ignored.
"""

from __future__ import annotations

import datetime as dt
import re
import signal
from dataclasses import dataclass
from typing import Any, Iterable, Optional, Union

FAILED_CREATE = "FailedCreate"
UNSCHEDULABLE = "Unschedulable"
IMAGE_PULL = "ImagePullBackOff"
INVALID_IMAGE = "InvalidImageName"
CONTAINER_CONFIG = "CreateContainerConfigError"
CONTAINER_CREATE = "CreateContainerError"
OOM_KILLED = "OOMKilled"
STARTUP_PROBE = "StartupProbeFailed"
CRASH_LOOP = "CrashLoopBackOff"
#: Every reason, in order of precedence (the module docstring says why).
PRECEDENCE = (FAILED_CREATE, UNSCHEDULABLE, IMAGE_PULL, INVALID_IMAGE, CONTAINER_CONFIG, CONTAINER_CREATE, OOM_KILLED,
              STARTUP_PROBE, CRASH_LOOP)
REASONS = frozenset(PRECEDENCE)

#: Whole messages stay within what an Event holds.
MAX_MESSAGE = 1024
#: One quoted piece of cluster text (a scheduler's or a webhook's message).
MAX_QUOTE = 600
#: vLLM's last log lines: this many, each this long, together at most LOG_TAIL_CHARS.
LOG_TAIL_LINES = 5
LOG_LINE_CHARS = 240
LOG_TAIL_CHARS = 600
#: An Unschedulable pod counts as failing only after this long, unless an autoscaler says it adds a node.
UNSCHEDULABLE_GRACE_SECONDS = 300
#: Events and container timestamps have whole seconds; a probe's kill is recorded before the container ends.
CLOCK_SLACK_SECONDS = 2
#: The kubelet's defaults for a probe without these fields.
PROBE_PERIOD_DEFAULT, PROBE_FAILURES_DEFAULT = 10, 3

_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")
_SPACES = re.compile(r"[\x00-\x20\x7f]+")
_STS_POD = re.compile(r"create Pod (\S+) in StatefulSet")
_IMAGE_IN_MESSAGE = re.compile(r'image "([^"]+)"')

Timestamp = Union[str, dt.datetime, None]


@dataclass(frozen=True)
class Failure:
    """Why pods do not serve: `reason` (CamelCase, one of REASONS) and `message` (for people)."""

    reason: str
    message: str
    #: May resolve by itself (a node is being added): named in Ready, but not Degraded.
    waiting: bool = False
    #: The pod or workload it is about.
    subject: str = ""


# --------------------------------------------------------------------------- text and time
def clean(text: Any, limit: int = MAX_QUOTE) -> str:
    """One line of at most `limit` characters: escape sequences dropped, control characters and runs of
    whitespace made one space, the end cut with an ellipsis."""
    one_line = _SPACES.sub(" ", _ANSI.sub("", str(text or ""))).strip()
    return one_line if len(one_line) <= limit else one_line[:limit - 1].rstrip() + "…"


def log_tail(text: Any) -> str:
    """The last few non-empty lines of a termination message (vLLM's log through FallbackToLogsOnError),
    each cut to LOG_LINE_CHARS, joined with " | ", earlier lines dropped to stay within LOG_TAIL_CHARS."""
    lines = [clean(line, LOG_LINE_CHARS) for line in _ANSI.sub("", str(text or "")).splitlines()]
    lines = [line for line in lines if line][-LOG_TAIL_LINES:]
    while len(lines) > 1 and len(" | ".join(lines)) > LOG_TAIL_CHARS:
        lines.pop(0)
    return clean(" | ".join(lines), LOG_TAIL_CHARS)


def parse_time(value: Timestamp) -> Optional[dt.datetime]:
    if isinstance(value, dt.datetime):
        return value if value.tzinfo else value.replace(tzinfo=dt.timezone.utc)
    if not value:
        return None
    try:
        parsed = dt.datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=dt.timezone.utc)


def event_time(event: dict[str, Any]) -> Optional[dt.datetime]:
    """When an Event last happened: the latest of the timestamps core/v1 and events.k8s.io/v1 carry."""
    series = event.get("series") or {}
    created = (event.get("metadata") or {}).get("creationTimestamp")
    stamps = [event.get("lastTimestamp"), event.get("deprecatedLastTimestamp"), series.get("lastObservedTime"),
              event.get("eventTime"), event.get("firstTimestamp"), created]
    times = [t for t in map(parse_time, stamps) if t is not None]
    return max(times) if times else None


def _subject(event: dict[str, Any]) -> dict[str, Any]:
    return event.get("involvedObject") or event.get("regarding") or {}


def _text(event: dict[str, Any]) -> str:
    return str(event.get("message") or event.get("note") or "")


def _about(event: dict[str, Any], kind: str, name: str, uid: Optional[str]) -> bool:
    obj = _subject(event)
    if obj.get("kind") != kind or obj.get("name") != name:
        return False
    return not (uid and obj.get("uid") and obj["uid"] != uid)  # an older object of the same name


def _by_time(events: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    epoch = dt.datetime.min.replace(tzinfo=dt.timezone.utc)
    return sorted(events, key=lambda e: event_time(e) or epoch)


# --------------------------------------------------------------------------- the classifier
def classify(pods: Iterable[dict[str, Any]], events: Iterable[dict[str, Any]] = (), *,
             workload: Optional[dict[str, Any]] = None, now: Timestamp = None) -> Optional[Failure]:
    """The failure to report for a server, given its pods and (optionally) the Events of its workload and
    pods; None when nothing fails. `workload` narrows the workload's Events to that object (kind, name,
    uid); `now` starts the Unschedulable grace (without it an Unschedulable pod fails at once)."""
    events = list(events)
    live = sorted((p for p in pods if not (p.get("metadata") or {}).get("deletionTimestamp")),
                  key=lambda p: p["metadata"].get("name", ""))
    found: list[Failure] = []
    created = failed_create(events, live, workload)
    if created:
        found.append(created)
    for pod in live:
        found += pod_failures(pod, events, parse_time(now))
    if not found:
        return None
    found.sort(key=lambda f: (f.waiting, PRECEDENCE.index(f.reason)))  # stable: pods stay in name order
    first, rest, seen = found[0], [], {found[0].subject}
    for f in found[1:]:  # each other failing pod once, by its first-ranked reason
        if not f.waiting and f.subject not in seen:
            rest.append(f)
            seen.add(f.subject)
    message = first.message
    if rest and not first.waiting:
        also = ", ".join(f"{f.subject} {f.reason}" for f in rest[:3]) + (", …" if len(rest) > 3 else "")
        message += f" (also failing: {also})"
    return Failure(first.reason, clean(message, MAX_MESSAGE), first.waiting, first.subject)


def failed_create(events: list[dict[str, Any]], pods: list[dict[str, Any]],
                  workload: Optional[dict[str, Any]] = None) -> Optional[Failure]:
    """The workload controller's latest FailedCreate, unless a pod was created after it (SuccessfulCreate)
    or the pod it names exists by now."""
    kinds = ("StatefulSet", "DaemonSet")
    mine = [e for e in events if _subject(e).get("kind") in kinds
            and e.get("reason") in ("FailedCreate", "SuccessfulCreate")]
    if workload is not None:
        meta = workload.get("metadata") or {}
        mine = [e for e in mine if _about(e, workload.get("kind", ""), meta.get("name", ""), meta.get("uid"))]
    # A StatefulSet's Events name the pod ("create Pod x-1 in StatefulSet x failed ..."): one verdict per pod.
    latest: dict[Optional[str], dict[str, Any]] = {}
    for e in _by_time(mine):
        named = _STS_POD.search(_text(e))
        latest[named.group(1) if named else None] = e
    existing = {p["metadata"].get("name") for p in pods}
    failing = [e for pod, e in latest.items() if e.get("reason") == "FailedCreate" and pod not in existing]
    if not failing:
        return None
    latest_failure = _by_time(failing)[-1]
    text = _text(latest_failure)
    obj = _subject(latest_failure)
    subject = f"{obj.get('kind')} {obj.get('name')}"
    hint = ""
    if "PodSecurity" in text and ("hostIPC" in text or "hostNetwork" in text):
        hint = (". The namespace's Pod Security level forbids host namespaces: use ipc: SharedMemory instead of "
                "ipc: Host (and no hostNetwork), or label the namespace for the privileged level")
    return Failure(FAILED_CREATE, f"{subject} cannot create its pods: {clean(text)}{hint}", subject=subject)


def pod_failures(pod: dict[str, Any], events: list[dict[str, Any]],
                 now: Optional[dt.datetime] = None) -> list[Failure]:
    """Everything wrong with one pod, in no particular order (classify ranks them)."""
    meta = pod.get("metadata") or {}
    name, uid = meta.get("name", ""), meta.get("uid")
    own = [e for e in events if _about(e, "Pod", name, uid)]
    out: list[Failure] = []
    unscheduled = unschedulable(pod, own, now)
    if unscheduled:
        out.append(unscheduled)
    spec, status = pod.get("spec") or {}, pod.get("status") or {}
    containers = {c.get("name"): c for c in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]}
    # Init containers first (the model's download): while one fails, the others never start.
    for cs in [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])]:
        out += container_failures(name, cs, containers.get(cs.get("name")) or {}, own)
    return out


def unschedulable(pod: dict[str, Any], events: list[dict[str, Any]],
                  now: Optional[dt.datetime] = None) -> Optional[Failure]:
    name = pod["metadata"].get("name", "")
    cond = next((c for c in (pod.get("status") or {}).get("conditions") or []
                 if c.get("type") == "PodScheduled" and c.get("status") == "False"
                 and c.get("reason") == "Unschedulable"), None)
    if cond is None:
        return None
    said = clean(cond.get("message") or "no node fits")
    hint = ""
    if "node affinity/selector" in said or "node selector" in said:
        hint = " Check spec.gpu.product (the nvidia.com/gpu.product label) and spec.nodeSelector"
    message = f"pod {name} cannot be scheduled: {said}{hint}"
    scaling = _by_time(e for e in events if e.get("reason") in ("TriggeredScaleUp", "NotTriggerScaleUp", "Nominated"))
    if scaling and scaling[-1].get("reason") != "NotTriggerScaleUp":
        adding = clean(_text(scaling[-1]), 200)
        return Failure(UNSCHEDULABLE, f"pod {name} waits for a node being added ({adding}): {said}", waiting=True,
                       subject=name)
    since = parse_time(cond.get("lastTransitionTime"))
    waiting = bool(now and since and (now - since).total_seconds() < UNSCHEDULABLE_GRACE_SECONDS)
    return Failure(UNSCHEDULABLE, message, waiting=waiting, subject=name)


def container_failures(pod: str, cs: dict[str, Any], container: dict[str, Any],
                       events: list[dict[str, Any]]) -> list[Failure]:
    """What keeps one container from serving; nothing when it is ready."""
    if cs.get("ready"):
        return []
    c = cs.get("name", "")
    state = cs.get("state") or {}
    waiting = state.get("waiting") or {}
    said = clean(waiting.get("message"))
    current = state.get("terminated") or {}
    last = current or (cs.get("lastState") or {}).get("terminated") or {}
    restarts = cs.get("restartCount", 0)
    out: list[Failure] = []

    def add(reason: str, message: str) -> None:
        out.append(Failure(reason, message, subject=pod))

    reason = waiting.get("reason")
    if reason in ("ErrImagePull", "ImagePullBackOff"):
        add(IMAGE_PULL, image_pull_message(pod, cs, container, said, events))
    elif reason == INVALID_IMAGE:
        add(INVALID_IMAGE, f"pod {pod}: the image reference {_image(cs, container, said)!r} is not valid: {said}; "
            "fix spec.image")
    elif reason in (CONTAINER_CONFIG, CONTAINER_CREATE):
        add(reason, f"pod {pod}: the kubelet cannot create container {c}: {said} (check the Secrets behind "
            "spec.hfTokenSecretRef and engine.env[].valueFrom)")
    if not last and reason != CRASH_LOOP:
        return out
    if last.get("reason") == "OOMKilled":
        add(OOM_KILLED, oom_message(pod, c, container, restarts))
    elif startup_probe_killed(cs, last, events):
        add(STARTUP_PROBE, startup_message(pod, c, container, last, restarts))
    elif reason == CRASH_LOOP or (last.get("exitCode") not in (None, 0) and (restarts or current)
                                  and last.get("reason") not in ("Unknown", "ContainerStatusUnknown")):
        add(CRASH_LOOP, crash_message(pod, c, last, restarts))
    return out


def _image(cs: dict[str, Any], container: dict[str, Any], said: str) -> str:
    m = _IMAGE_IN_MESSAGE.search(said)
    return container.get("image") or cs.get("image") or (m.group(1) if m else "?")


def image_pull_message(pod: str, cs: dict[str, Any], container: dict[str, Any], said: str,
                       events: list[dict[str, Any]]) -> str:
    """The image and the registry's answer: the back-off's own message says only "Back-off pulling image", so
    the kubelet's latest "Failed to pull image" Event is quoted when there is one."""
    pulls = [e for e in events if e.get("reason") == "Failed" and "Failed to pull image" in _text(e)]
    detail = clean(_text(_by_time(pulls)[-1])) if pulls else said
    kubelet = ((cs.get("state") or {}).get("waiting") or {}).get("reason")
    return (f"pod {pod}: cannot pull image {_image(cs, container, said)!r} ({kubelet}): {detail}. Check spec.image; "
            "a private registry needs imagePullSecrets on the ServiceAccount (spec.serviceAccountName)")


def oom_message(pod: str, c: str, container: dict[str, Any], restarts: int) -> str:
    limit = ((container.get("resources") or {}).get("limits") or {}).get("memory")
    if limit:
        why = (f"it used more than its memory limit {limit} (host memory, not GPU memory; the in-memory /dev/shm "
               "counts too). Raise spec.resources.limits.memory")
    else:
        why = "the node ran out of memory (the container has no memory limit)"
    return f"pod {pod}: container {c} was OOMKilled ({restarts} restarts): {why}"


def startup_budget(container: dict[str, Any]) -> tuple[int, int, int]:
    """(seconds, failureThreshold, periodSeconds) of the container's startup probe."""
    probe = container.get("startupProbe") or {}
    period = int(probe.get("periodSeconds") or PROBE_PERIOD_DEFAULT)
    failures = int(probe.get("failureThreshold") or PROBE_FAILURES_DEFAULT)
    return int(probe.get("initialDelaySeconds") or 0) + period * failures, failures, period


def startup_probe_killed(cs: dict[str, Any], last: dict[str, Any], events: list[dict[str, Any]]) -> bool:
    """Whether the container's last run ended because its startup probe ran out: the kubelet's Killing
    Event ("Container vllm failed startup probe, will be restarted") during that run, or its Unhealthy
    "Startup probe failed" Events during a run that ended with a signal or cleanly (a kill, not a crash)."""
    c = cs.get("name", "")
    start, end = parse_time(last.get("startedAt")), parse_time(last.get("finishedAt"))
    slack = dt.timedelta(seconds=CLOCK_SLACK_SECONDS)

    def during_run(e: dict[str, Any]) -> bool:
        path = _subject(e).get("fieldPath")
        if path and path != f"spec.containers{{{c}}}":
            return False
        t = event_time(e)
        return t is None or ((start is None or t >= start - slack) and (end is None or t <= end + slack))

    kills = [_text(e) for e in events if e.get("reason") == "Killing" and during_run(e)]
    if any("failed startup probe" in text for text in kills):
        return True
    if kills:  # killed for something else (a liveness probe, a deletion)
        return False
    probed = any(e.get("reason") == "Unhealthy" and _text(e).startswith("Startup probe failed") and during_run(e)
                 for e in events)
    return probed and last.get("exitCode") in (0, 128 + signal.SIGKILL, 128 + signal.SIGTERM)


def startup_message(pod: str, c: str, container: dict[str, Any], last: dict[str, Any], restarts: int) -> str:
    seconds, failures, period = startup_budget(container)
    path = ((container.get("startupProbe") or {}).get("httpGet") or {}).get("path", "/health")
    tail = log_tail(last.get("message"))
    return (f"pod {pod}: container {c} did not answer {path} within its startup probe's {seconds} s "
            f"(failureThreshold {failures} x periodSeconds {period}) and was restarted ({restarts} restarts): the "
            "model loads slower than planned (a cache volume, spec.cache, keeps the weights across restarts)"
            + (f"; last log lines: {tail}" if tail else ""))


def _exit(code: Any) -> str:
    if isinstance(code, int) and code > 128:
        try:
            return f"exit code {code} ({signal.Signals(code - 128).name})"
        except ValueError:
            pass
    return f"exit code {code}"


#: The init container that downloads the model (builders.DOWNLOAD_CONTAINER).
DOWNLOAD_CONTAINER = "download"


def crash_message(pod: str, c: str, last: dict[str, Any], restarts: int) -> str:
    tail = log_tail(last.get("message"))
    said = f"last log lines: {tail}" if tail else f"no termination message; see kubectl logs {pod} --previous"
    what = (f"the model's download (init container {c}) keeps failing" if c == DOWNLOAD_CONTAINER
            else f"container {c} keeps exiting")
    hint = ("; a gated or private model needs spec.hfTokenSecretRef (a token with access to it), and "
            "spec.model.name and spec.model.revision must exist on the Hub" if c == DOWNLOAD_CONTAINER else "")
    return (f"pod {pod}: {what} (CrashLoopBackOff, {_exit(last.get('exitCode'))}, {restarts} restarts); {said}"
            + hint)
