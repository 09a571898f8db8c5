"""What a hostile tenant sends, through the code of main before tenant-safety ("old") and this checkout ("new").

    python bench/adversarial.py             # about 1-2 minutes on 2 cores
    python bench/adversarial.py --full      # adds 400 KB credential-check inputs: the old one takes minutes

Prints figures; it is not a test (tests/unit/test_tenant_safety.py and tests/unit/test_security.py assert the behaviour;
tests/unit/test_chattemplate.py, tests/unit/test_metrics.py and e2e/test_containment_bounds_e2e.py the operator's own bounds).
The chat template and metrics port sections compare with main at 6bf2599 (issue 18), its checker read from git.
"Old" is main at ac6cb69, its functions copied below as they were: the credential expression, parse_quantity,
the config.json read (16 MiB cap, json.loads), the /metrics parse (prometheus_client on the whole body) and the urllib fetch.
Peak memory is measured in a child process per case (ru_maxrss after the input is built, then after the parse).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from decimal import Decimal
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "operator"), str(ROOT)]

from e2e.testbed.hostile_http import HostileServer, Reply, redirect_to, secret_page  # noqa: E402
from vllm_operator import api, validation  # noqa: E402
from vllm_operator.sources import fetch, model_facts  # noqa: E402
from vllm_operator.sources import vllm_metrics as metrics  # noqa: E402
from e2e.testbed.vllm_metrics_text import VLLM_METRICS  # noqa: E402 - vLLM 0.32's /metrics shape

# --------------------------------------------------------------------------- the old code, as it was
OLD_CREDENTIAL_VALUE = re.compile(
    r"(hf_[A-Za-z0-9]{16,}|sk-[A-Za-z0-9_-]{16,}|gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,}"
    r"|(AKIA|ASIA)[0-9A-Z]{16}|xox[abprs]-[A-Za-z0-9-]{10,}|eyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\."
    r"|-----BEGIN [A-Z ]*PRIVATE KEY-----|[a-z][a-z0-9+.-]*://[^/\s:@]+:[^/\s@]+@)")
OLD_MAX_CONFIG_BYTES = 16 * 2**20


def old_parse_quantity(value: str) -> Decimal:
    m = re.match(r"^([+-]?[0-9.]+)([eE][+-]?[0-9.]+)?(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE])?$", value)
    assert m is not None
    return Decimal(m.group(1) + (m.group(2) or "")) * Decimal(api._SUFFIX[m.group(3) or ""])


def old_parse_metrics(text: str) -> Any:
    from prometheus_client.parser import text_string_to_metric_families
    return [s.value for f in text_string_to_metric_families(text) for s in f.samples]


def old_http_get(url: str, timeout: float) -> bytes:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(url, timeout=timeout) as resp:
        return resp.read(8 * 2**20)


# --------------------------------------------------------------------------- helpers
def timed(fn: Callable[[], Any]) -> tuple[float, str]:
    """Seconds, and the outcome: 'ok', a fetch's category, or the exception's type."""
    t0 = time.perf_counter()
    try:
        fn()
        outcome = "ok"
    except fetch.FetchError as e:
        outcome = f"'{e}'"
    except BaseException as e:  # noqa: BLE001 - the outcome is what is measured
        outcome = type(e).__name__
    return time.perf_counter() - t0, outcome


def row(*cells: Any) -> None:
    print("| " + " | ".join(str(c) for c in cells) + " |")


def header(title: str, *columns: str) -> None:
    print(f"\n### {title}\n")
    row(*columns)
    row(*["---"] * len(columns))


def ratio(old: float, new: float) -> str:
    return f"{old / max(new, 1e-6):,.0f}x"


# --------------------------------------------------------------------------- the credential check
def credential_inputs(sizes: list[int]) -> list[tuple[str, str]]:
    shapes = {"lowercase letters (URL scheme)": "a", "'eyJ' repeated (JWT)": "eyJ", "'a://b:' + letters (password)": "c"}
    out = []
    for size in sizes:
        for label, unit in shapes.items():
            text = unit * (size // len(unit))
            out.append((f"{label}, {size // 1024} KB", "a://b:" + text if "password" in label else text))
    return out


def bench_credentials(sizes: list[int]) -> None:
    header("credential check (validation._CREDENTIAL_VALUE.search) on one string", "input", "old", "new", "old/new")
    for label, text in credential_inputs(sizes):
        old, _ = timed(lambda: OLD_CREDENTIAL_VALUE.search(text))
        new, _ = timed(lambda: validation._CREDENTIAL_VALUE.search(text))
        row(label, f"{old:.3f} s", f"{new * 1000:.2f} ms", ratio(old, new))


# --------------------------------------------------------------------------- quantities
def old_plan_step(value: str) -> None:
    """What the old planner did with gpu.memory: int(quantity), a problem below 1 GiB, else its first float step."""
    total = int(old_parse_quantity(value))
    if total >= 2**30:
        _ = (total - 0 - 0.75 * 2**30) / total


def bench_quantities() -> None:
    header("quantities (gpu.memory)", "value", "old: parse, then the planner", "new: api.parse_quantity")
    for value in ("1e400", "1e-400", "1e9999999", "1e1.5", "9" * 400):
        _, old = timed(lambda: old_plan_step(value))
        old = "a problem: less than 1Gi" if old == "ok" else old
        _, new = timed(lambda: api.parse_quantity(value))
        row(value if len(value) < 20 else f"'9' x {len(value)}", old,
            "ValueError (a problem naming the field)" if new == "ValueError" else new)


# --------------------------------------------------------------------------- config.json
CHILD = """
import json, sys, time
sys.path[:0] = {paths!r}
sys.setrecursionlimit(1000)
from vllm_operator.sources import model_facts  # noqa: E402 - in the baseline for both: the operator has it loaded


def peak():  # VmHWM: ru_maxrss would carry the parent's high-water mark across fork and exec
    line = next(l for l in open("/proc/self/status") if l.startswith("VmHWM:"))
    return int(line.split()[1]) / 1024


raw = {build}
before, t0 = peak(), time.perf_counter()
outcome = "ok"
try:
    {parse}
except BaseException as e:
    outcome = type(e).__name__
print(json.dumps([before, peak(), outcome, time.perf_counter() - t0]))
"""
#: The old read: at most 16 MiB, then json.loads of all of it.
OLD_CONFIG = "assert len(raw) <= {cap}; json.loads(raw.decode('utf-8'))".format(cap=OLD_MAX_CONFIG_BYTES)
#: The new one: at most 1 MiB, then model_facts's parse (fetch.load_json: depth scan, json.loads; an object).
NEW_CONFIG = "assert len(raw) <= model_facts.MAX_CONFIG_BYTES; model_facts._config_object(raw, 'bench')"


def in_child(build: str, parse: str) -> tuple[float, float, str, float]:
    """(peak RSS MiB once the input exists, peak RSS MiB after the parse, outcome, seconds of the parse)."""
    code = CHILD.format(paths=[str(ROOT / "operator"), str(ROOT)], build=build, parse=parse)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    before, after, outcome, seconds = json.loads(out)
    return before, after, outcome, seconds


def bench_config() -> None:
    header("config.json parse, in a fresh interpreter: peak RSS (VmHWM) after the parse, and before it with the "
           "input built", "input", "old: 16 MiB cap, json.loads", "new: 1 MiB cap, depth scan, json.loads")
    empties = "b'{{\"a\":[' + b'{{}},' * ({n} // 3) + b'{{}}]}}'"
    cases = [("16 MiB of {\"a\":[{},{},...]}", empties.format(n=OLD_MAX_CONFIG_BYTES - 16)),
             ("1 MiB of the same (the most new accepts)", empties.format(n=model_facts.MAX_CONFIG_BYTES - 16)),
             ("[[[...]]] 100,000 deep (195 KB)", "b'[' * 100000 + b']' * 100000")]
    for label, build in cases:
        cells = []
        for parse in (OLD_CONFIG, NEW_CONFIG):
            before, after, outcome, seconds = in_child(build, parse)
            result = {"ok": "parsed", "AssertionError": "refused: too large", "ValueError": "refused"}.get(outcome,
                                                                                                     outcome)
            cells.append(f"{result} in {seconds:.2f} s, peak {after:.0f} MiB ({before:.0f} before)")
        row(label, *cells)


# --------------------------------------------------------------------------- /metrics
def escaped_label_line(size: int) -> str:
    return 'vllm:num_requests_waiting{engine="0",x="' + '\\"' * (size // 2) + '"} 4\n'


def bench_metrics(sizes: list[int]) -> None:
    header("/metrics parse", "input", "old: prometheus_client on the body",
           "new: prometheus_client on the gauges' bounded lines", "old/new")
    typical = VLLM_METRICS * (30_000 // len(VLLM_METRICS))
    line = escaped_label_line(metrics.MAX_LINE_BYTES - 64)
    at_cap = line * (metrics.MAX_SELECTED_BYTES // len(line))  # the worst the parser may be handed
    for label, text in [("a vLLM-like body, 30 KB", typical)] + [
            (f"one label of escaped quotes, {size // 1024} KB", escaped_label_line(size)) for size in sizes] + [
            (f"4 KB lines of escaped quotes, {len(at_cap) // 1024} KB (the most parsed)", at_cap)]:
        old, _ = timed(lambda: old_parse_metrics(text))
        new, _ = timed(lambda: metrics.parse_vllm_metrics("p", text, 0.0))
        row(label, f"{old:.3f} s", f"{new * 1000:.2f} ms", ratio(old, new))
    nan = VLLM_METRICS.replace("} 5.0", "} NaN")
    old = sum(old_parse_metrics(nan)[2:4])
    new = metrics.parse_vllm_metrics("p", nan, 0.0)
    row("waiting = NaN", f"parsed: waiting sum {old}", f"failed: {new.error}", "")


# --------------------------------------------------------------------------- fetches
def bench_fetches() -> None:
    header("fetches from a hostile server (1 s timeout or deadline; a trickle sends 1 byte per 0.1 s)",
           "attack", "old: urllib", "new: fetch.get")
    routes = {"/redirect": redirect_to("/secret"), "/secret": secret_page(),
              "/trickle": Reply(200, b"x" * 100, trickle=0.1),
              "/headers": Reply(200, b"{}", headers=(("X-Pad", "p" * 100),), trickle=0.1, trickle_headers=True)}
    with HostileServer(routes) as s:
        for path in ("/redirect", "/trickle", "/headers"):
            before = len(s.requests)
            old, old_outcome = timed(lambda: old_http_get(s.base + path, 1.0))
            followed = "/secret" in s.requests[before:]
            new, new_outcome = timed(lambda: fetch.get(s.base + path, seconds=1.0, max_bytes=8 * 2**20))
            row(path[1:], f"{old:.1f} s, {old_outcome}{', followed to /secret' if followed else ''}",
                f"{new:.1f} s, {new_outcome}")


# --------------------------------------------------------------------------- chat templates (issue 18)
#: main before the operator's bounds (issue 18): its chatTemplate.py is read from git as it was.
OLD_COMMIT = "6bf2599"
TEMPLATE_CHILD = """
import json, resource, sys, importlib.util
sys.path[:0] = {paths!r}
{load}
problem = checker.problem({template!r})
print(json.dumps([problem, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024]))
"""
LOAD_NEW = "from vllm_operator import chattemplate as checker"
LOAD_OLD = ("spec = importlib.util.spec_from_loader('old_chattemplate', loader=None); "
            "checker = importlib.util.module_from_spec(spec); exec({source!r}, checker.__dict__)")
TEMPLATES = {
    "90 lists of 100,000 integers (each under every cap)":
        "".join(f"{{% set a{i} = range(99999)|list %}}" for i in range(90)) + "{{ messages[0]['content'] }}",
    "`~` doubling a string 30 times": "{% set ns = namespace(s='xx') %}{% set s = 'ab' %}"
        + "".join("{% set s = s ~ s %}" for _ in range(30)) + "{{ s|length }}",
    "a vLLM-style template (Llama 3)": "{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>"
        "\n\n{{ m['content'] | trim }}<|eot_id|>{% endfor %}",
}


def template_child(load: str, template: str) -> tuple[str, float]:
    """(verdict, the checking child's peak resident MiB), in a fresh interpreter."""
    code = TEMPLATE_CHILD.format(paths=[str(ROOT / "operator"), str(ROOT)], load=load, template=template)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    problem, peak = json.loads(out)
    return ("accepted" if problem is None else problem[:60]), peak


def bench_templates() -> None:
    try:
        old_source = subprocess.run(["git", "-C", str(ROOT), "show", f"{OLD_COMMIT}:operator/vllm_operator/"
                                     "chattemplate.py"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        print(f"\n(chat templates: main at {OLD_COMMIT} is not in this clone's history; skipped)")
        return
    header("chat template check: the checking child's verdict and peak resident memory (the operator's container "
           "has 256 MiB)", "template", f"old ({OLD_COMMIT}: RLIMIT_AS 512 MiB)", "new (64 MiB, strings capped)",
           "old/new memory")
    for label, template in TEMPLATES.items():
        old, old_peak = template_child(LOAD_OLD.format(source=old_source), template)
        new, new_peak = template_child(LOAD_NEW, template)
        row(label, f"{old}, {old_peak:.0f} MiB", f"{new}, {new_peak:.0f} MiB", f"{old_peak / new_peak:.1f}x")


# --------------------------------------------------------------------------- the metrics port (issue 18)
def process_figures() -> tuple[int, float]:
    status = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines() if ":" in line)
    return int(status["Threads"]), int(status["VmRSS"].split()[0]) / 1024


def idle(port: int, count: int) -> list:
    import socket
    out = []
    for i in range(count):
        s = socket.socket()
        s.bind((f"127.0.4.{1 + i % 250}", 0))
        s.settimeout(2)
        try:
            s.connect(("127.0.0.1", port))
            out.append(s)
        except OSError:
            s.close()
    return out


def old_metrics_server() -> Any:
    """main's server: http.server's ThreadingHTTPServer, one thread per connection, no timeout."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            self.send_response(200)
            self.end_headers()

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def bench_idle_connections(count: int) -> None:
    from vllm_operator import telemetry
    header(f"{count} idle connections to the metrics port (from 250 addresses): the operator process's threads "
           "and resident memory", "server", "threads before -> after", "resident MiB before -> after")
    for label, start in (("old: ThreadingHTTPServer", old_metrics_server),
                         ("new: telemetry.HealthServer", lambda: telemetry.serve(0, telemetry.Health(),
                                                                                 host="127.0.0.1"))):
        server = start()
        threads, rss = process_figures()
        sockets = idle(server.server_address[1], count)
        time.sleep(1.0)
        threads_after, rss_after = process_figures()
        row(label, f"{threads} -> {threads_after}", f"{rss:.0f} -> {rss_after:.0f}")
        for sock in sockets:
            sock.close()
        server.shutdown()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--full", action="store_true", help="add 400 KB credential-check inputs (old: minutes)")
    args = parser.parse_args(argv)
    print(f"# bench/adversarial.py, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
          f"load averages {', '.join(f'{x:.1f}' for x in os.getloadavg())}")
    bench_credentials([8 * 1024, 32 * 1024, 64 * 1024] + ([400 * 1024] if args.full else []))
    bench_quantities()
    bench_config()
    bench_metrics([64 * 1024, 256 * 1024, 1024 * 1024])
    bench_fetches()
    bench_templates()
    bench_idle_connections(1000)
    return 0


if __name__ == "__main__":
    sys.exit(main())
