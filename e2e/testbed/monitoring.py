"""The chart's alerts and Grafana dashboard as tests read them, and promtool to check them.

    rule_groups({"requestErrors": {"ratio": 0.1}})   # the PrometheusRule's groups, rendered by Helm
    dashboard_queries()                             # every panel's PromQL, Grafana variables filled in
    dashboard_queries({"__rate_interval": "1m"})    # ... with a shorter rate window
    promql_errors(["sum(rate(x[5m]))"])             # {} when promtool parses them all
    metric_names('sum by (pod) (rate(vllm:num_preemptions_total{pod="a"}[5m]))')   # {"vllm:num_preemptions_total"}

promtool comes with Debian's ``prometheus`` package, installed when missing (e2e/testbed/prometheus.py).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Mapping, Optional

import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "vllm-operator"
DASHBOARD = CHART / "files" / "vllm-operator-dashboard.json"

#: Values for the dashboard's variables when its queries run outside Grafana: every namespace and
#: server, and a fixed rate window for Grafana's $__rate_interval.
DEFAULT_VARIABLES = {"namespace": ".+", "server": ".+", "__rate_interval": "5m", "__interval": "1m",
                     "__range": "1h"}


# --------------------------------------------------------------------------- promtool
def promtool() -> str:
    """The promtool binary (installs Debian's prometheus package, which ships it, when missing)."""
    found = shutil.which("promtool") or ("/usr/bin/promtool" if Path("/usr/bin/promtool").exists() else None)
    if found:
        return found
    from e2e.testbed.prometheus import ensure_prometheus

    ensure_prometheus()
    found = shutil.which("promtool") or "/usr/bin/promtool"
    if not Path(found).exists():
        raise RuntimeError("Debian's prometheus package is installed but has no promtool")
    return found


def run_promtool(*args: str, cwd: Optional[Path] = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([promtool(), *args], capture_output=True, text=True, cwd=cwd, timeout=timeout)


def promql_errors(exprs: list[str]) -> dict[str, str]:
    """Each expression promtool cannot parse, with its message ({} when all parse).

    promtool has no command that checks a query, but `check rules` parses each rule's PromQL:
    every expression becomes a recording rule of its own group."""
    def check(batch: list[str]) -> subprocess.CompletedProcess:
        groups = [{"name": f"q{i}", "rules": [{"record": f"dashboard:q{i}", "expr": e}]} for i, e in enumerate(batch)]
        with tempfile.TemporaryDirectory(prefix="promql-") as tmp:
            path = Path(tmp) / "queries.yaml"
            path.write_text(yaml.safe_dump({"groups": groups}, sort_keys=False))
            return run_promtool("check", "rules", str(path))

    if not exprs or check(exprs).returncode == 0:
        return {}
    errors = {}
    for e in exprs:  # promtool stops at the first bad group: ask again one by one to name them all
        p = check([e])
        if p.returncode != 0:
            errors[e] = (p.stderr or p.stdout).strip()
    return errors


# --------------------------------------------------------------------------- alerts
def rule_groups(rule_values: Optional[Mapping[str, Any]] = None, *, namespace: str = "vllm-operator",
                release: str = "vllm-operator") -> list[dict[str, Any]]:
    """The rule groups of the chart's PrometheusRule, rendered by Helm with prometheusRule.enabled
    and `rule_values` merged into prometheusRule."""
    from vllm_operator import generate

    values = {"prometheusRule": {"enabled": True, **(rule_values or {})}}
    (rule,) = [o for o in generate.render_chart(CHART, values, namespace=namespace, release=release)
               if o["kind"] == "PrometheusRule"]
    return rule["spec"]["groups"]


def alerts(groups: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Alert name -> its rule."""
    return {r["alert"]: r for g in groups for r in g["rules"] if "alert" in r}


# --------------------------------------------------------------------------- the dashboard
@dataclass(frozen=True)
class Query:
    """One target of one panel of the dashboard."""

    panel: str
    ref_id: str
    expr: str
    """PromQL, Grafana's variables replaced."""
    template: str
    """As written in the dashboard."""


def dashboard(path: Path = DASHBOARD) -> dict[str, Any]:
    return json.loads(path.read_text())


def panels(dash: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel, rows' nested panels included (a collapsed row keeps its panels inside)."""
    for p in dash.get("panels") or []:
        yield p
        yield from panels(p)


_VARIABLE = re.compile(r"\$\{(\w+)(?::[^}]*)?\}|\$(\w+)|\[\[(\w+)(?::[^\]]*)?\]\]")


def substitute(template: str, variables: Mapping[str, str]) -> str:
    """`template` with Grafana's $var, ${var}, ${var:format} and [[var]] replaced.

    A `$1` (label_replace's capture group) is left alone; any other unknown variable is an error,
    so no query ever reaches Prometheus with a Grafana variable in it."""
    def one(m: re.Match) -> str:
        name = m.group(1) or m.group(2) or m.group(3)
        if name.isdigit():
            return m.group(0)
        if name not in variables:
            raise KeyError(f"no value for Grafana variable ${name} in {template!r}")
        return variables[name]

    return _VARIABLE.sub(one, template)


def dashboard_queries(variables: Optional[Mapping[str, str]] = None, path: Path = DASHBOARD) -> list[Query]:
    """Every panel target's PromQL, with the variables filled in (DEFAULT_VARIABLES, overridden by `variables`)."""
    values = {**DEFAULT_VARIABLES, **(variables or {})}
    out = []
    for p in panels(dashboard(path)):
        for t in p.get("targets") or []:
            if t.get("expr"):
                out.append(Query(p.get("title", ""), t.get("refId", ""), substitute(t["expr"], values), t["expr"]))
    return out


# --------------------------------------------------------------------------- metric names in PromQL
#: Words that are not metric names: operators and modifiers, and what is left of the literals.
_KEYWORDS = {"and", "or", "unless", "bool", "by", "without", "on", "ignoring", "group_left", "group_right",
             "offset", "inf", "nan", "atan2"}
_IDENTIFIER = re.compile(r"(?<![\w:.])[A-Za-z_:][\w:]*")


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects (not a full parser: enough for the chart's
    queries, which promtool parses first).

    String literals, label matchers ({...}), ranges ([...]) and the label lists of by, without,
    on, ignoring, group_left and group_right go first; of the words left, those followed by "("
    are functions or aggregations, the keywords are operators, and the rest are metric names."""
    s = re.sub(r'"(?:\\.|[^"\\])*"|\'(?:\\.|[^\'\\])*\'|`[^`]*`', '""', expr)
    s = re.sub(r"\{[^}]*\}", " ", s)
    s = re.sub(r"\[[^\]]*\]", " ", s)
    s = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", s)
    names = set()
    for m in _IDENTIFIER.finditer(s):
        word = m.group(0)
        if word in _KEYWORDS or s[m.end():].lstrip().startswith("("):
            continue
        names.add(word)
    return names
