"""Cold start from zero replicas beside a warm request, on the real vLLM CPU server (the tiny model, cached on
local disk): what scale to zero costs the first request (docs/scale-to-zero.md).

    python bench/cold_start.py               # 3 cold starts, 10 warm requests each
    python bench/cold_start.py --trials 5 --json out/cold-start.json

cold   a request is sent at t0 while no server runs; the server is started at t0 (what the autoscaler's
       scale-from-zero sets going, minus the operator's read interval and the pod's scheduling), the request is
       retried every 0.2 s until vLLM answers, and its first streamed token is timed: request -> first token.
       Split into the process start -> /health (the model load and engine start) and /health -> first token.
warm   the same request against the running server: request -> first token.
The ratio is cold / warm (medians). Not a test: it prints figures. Everything it starts, it stops.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Optional

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from e2e.testbed import vllm_env  # noqa: E402

PROMPT = "The quick brown fox"


def first_token(base: str, timeout: float = 60) -> Optional[float]:
    """Seconds from sending a streamed completion to its first token; None when the server does not answer."""
    body = json.dumps({"model": "tiny", "prompt": PROMPT, "max_tokens": 16, "stream": True,
                       "temperature": 0}).encode()
    req = urllib.request.Request(base + "/v1/completions", data=body, headers={"Content-Type": "application/json"})
    start = time.monotonic()
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            for line in r:
                if line.startswith(b"data: {"):
                    return time.monotonic() - start
    except (urllib.error.URLError, OSError, ConnectionError):
        return None
    return None


def cold(host: str, port: int, logdir: Path) -> tuple[dict[str, float], vllm_env.VLLMProcess]:
    """One cold start: the request's clock starts with the server's."""
    t0 = time.monotonic()
    server = vllm_env.start_vllm(host, port, max_num_seqs=2, max_model_len=1024,
                                 log_path=logdir / f"vllm-cold-{int(time.time())}.log", engine_nice=None)
    base = f"http://{host}:{port}"
    healthy = None
    while time.monotonic() - t0 < 600:
        if healthy is None and server.is_healthy():
            healthy = time.monotonic() - t0
        if healthy is not None:
            ttft = first_token(base)
            if ttft is not None:
                return {"request_to_first_token": time.monotonic() - t0, "start_to_health": healthy,
                        "health_to_first_token": time.monotonic() - t0 - healthy}, server
        if not server.alive():
            raise RuntimeError(f"vLLM exited:\n{server.log_tail()}")
        time.sleep(0.2)
    raise TimeoutError(f"vLLM did not answer within 600 s:\n{server.log_tail()}")


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--warm", type=int, default=10, help="warm requests per trial")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    vllm_env.ensure_vllm()
    logdir = Path("out/bench-cold-start")
    logdir.mkdir(parents=True, exist_ok=True)
    host, port = "127.0.0.1", vllm_env.free_port()
    colds: list[dict[str, float]] = []
    warms: list[float] = []
    for trial in range(args.trials):
        figures, server = cold(host, port, logdir)
        try:
            colds.append(figures)
            for _ in range(args.warm):
                t = first_token(f"http://{host}:{port}")
                if t is not None:
                    warms.append(t)
        finally:
            server.stop(grace=5)
        print(f"trial {trial + 1}: cold {figures['request_to_first_token']:.1f} s "
              f"(start -> /health {figures['start_to_health']:.1f} s, then {figures['health_to_first_token']:.2f} s)",
              flush=True)
    cold_median = statistics.median(c["request_to_first_token"] for c in colds)
    warm_median = statistics.median(warms)
    result: dict[str, Any] = {
        "trials": args.trials, "cold_request_to_first_token_s": [round(c["request_to_first_token"], 2) for c in colds],
        "cold_start_to_health_s": [round(c["start_to_health"], 2) for c in colds],
        "warm_first_token_s_median": round(warm_median, 4), "cold_first_token_s_median": round(cold_median, 2),
        "ratio_cold_over_warm": round(cold_median / warm_median, 1)}
    print(f"cold start (request -> first token from zero): median {cold_median:.1f} s over {args.trials}; "
          f"warm request -> first token: median {warm_median * 1000:.0f} ms over {len(warms)}; "
          f"ratio {cold_median / warm_median:.0f}x")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
