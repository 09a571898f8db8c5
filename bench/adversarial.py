"""What a hostile tenant sends, through the code of main before tenant-safety ("old") and this checkout ("new").

    python bench/adversarial.py             # about 1-2 minutes on 2 cores
    python bench/adversarial.py --full      # adds 400 KB credential-check inputs: the old one takes minutes

Prints figures; it is not a test (tests/unit/test_tenant_safety.py and tests/unit/test_security.py assert the behaviour).
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
