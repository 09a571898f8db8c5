"""The `vllm-operator` command: offline plan/render/crd, and `run` for the operator itself."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any, Optional, TextIO, Union

import yaml

from . import api, catalog, crd, documents, pipeline
from .sources import hub
from .planner import GiB, Plan
from .postbuild import Built
from .urlpolicy import URLPolicy

BAR_WIDTH = 60
SEGMENTS = [  # (attribute or key, symbol, label)
    ("weights", "W", "weights"),
    ("activation", "A", "activation peak"),
    ("non_torch", "O", "non-torch (cuBLAS, NCCL)"),
    ("cuda_graphs", "G", "CUDA graphs"),
    ("lora", "L", "LoRA adapter slots"),
    ("kv_cache", "K", "KV cache"),
    ("reserved", "R", "reserved (gpu.reservedMemory)"),
    ("unused", ".", "outside budget (CUDA ctx, free)"),
]


def _read(path: str) -> str:
    if path == "-":
        return sys.stdin.read()
    with open(path, encoding="utf-8") as f:
        return f.read()


def memory_rows(plan: Plan) -> list[tuple[str, str, int]]:
    m = plan.memory
    assert m is not None
    used = m.weights + m.activation + m.non_torch + m.kv_cache + m.cuda_graphs + m.lora + m.reserved
    values = {
        "weights": m.weights, "activation": m.activation, "non_torch": m.non_torch, "kv_cache": m.kv_cache,
        "cuda_graphs": m.cuda_graphs, "lora": m.lora, "reserved": m.reserved, "unused": max(0, m.total - used),
    }
    # The LoRA slots' row only for a server with adapters (spec.adapters).
    return [(sym, label, values[key]) for key, sym, label in SEGMENTS if key != "lora" or m.lora]


def memory_bar(plan: Plan) -> str:
    rows = memory_rows(plan)
    assert plan.memory is not None  # drawn only for a plan that sized its memory
    total = plan.memory.total
    bar, acc, drawn = "", 0, 0
    for sym, _, value in rows:
        acc += value
        upto = round(acc / total * BAR_WIDTH)
        bar += sym * max(0, upto - drawn)
        drawn = max(drawn, upto)
    return "[" + bar.ljust(BAR_WIDTH, ".")[:BAR_WIDTH] + "]"


#: The header's words for each kind of problem (api.SPEC_REASONS, the reasons of SpecValid and Ready).
HEADLINES = {api.REASON_INVALID_SPEC: "INVALID SPEC", api.REASON_DOES_NOT_FIT: "DOES NOT FIT",
             api.REASON_MODEL_UNKNOWN: "MODEL UNKNOWN", api.REASON_GPU_UNKNOWN: "GPU UNKNOWN"}


def headline(plan: Plan) -> str:
    """`fits`, or the kinds of the plan's problems in capitals: DOES NOT FIT only for memory."""
    return ", ".join(HEADLINES.get(kind, kind) for kind in plan.problem_kinds()) or "fits"


def render_table(plan: Plan, out: TextIO) -> None:
    spec = plan.spec
    w = out.write
    gpu_name = plan.gpu.description
    group = f"{plan.nodes} nodes of " if plan.nodes > 1 else ""
    w(f"{plan.namespace}/{plan.name}: {spec.model.name} on {group}{spec.gpu.count} x {gpu_name}")
    if plan.gpu_memory:
        w(f" ({plan.gpu_memory / GiB:.2f} GiB each)")
    w(f"  [{headline(plan)}]\n")
    if plan.model:
        w(f"  model: {plan.model.source}\n")
    if plan.memory:
        w(f"  memory per GPU  {memory_bar(plan)}  budget {plan.memory.budget / GiB:.2f} GiB "
          f"(--gpu-memory-utilization {plan.gpu_memory_utilization:.2f})\n")
        for sym, label, value in memory_rows(plan):
            share = value / plan.memory.total * 100
            w(f"    {sym} {label:<31} {value / GiB:7.2f} GiB {share:5.1f}%\n")
    if plan.decisions:
        w("  flags\n")
        for d in plan.decisions:
            flag = f"{d.flag} {d.value}".strip()
            w(f"    {flag:<34} {'[pinned] ' if d.pinned else ''}{d.why}\n")
    if plan.kv_cache_tokens:
        if plan.nodes > 1:
            w(f"  group: {plan.nodes} nodes x {spec.gpu.count} GPU(s) = {plan.nodes * spec.gpu.count} GPUs "
              f"(tensor parallel {plan.tensor_parallel_size} x pipeline {plan.pipeline_parallel_size}), one "
              "LeaderWorkerSet group per replica\n")
        per = " per group" if plan.nodes > 1 else ""
        w(f"  capacity{per}: {plan.kv_cache_tokens:,} KV tokens ({plan.kv_bytes_per_token:,} bytes/token/GPU); "
          f"{plan.max_concurrency:.2f} concurrent requests of {plan.max_model_len:,} tokens\n")
    for note in plan.notes:
        w(f"  note: {note}\n")
    if plan.problems:  # each problem is one line on stderr (file: server: field: message), not repeated here
        w(f"  {len(plan.problems)} problem{'s' if len(plan.problems) > 1 else ''}: see the error output\n")
    if plan.args:
        w("  args: vllm serve " + " ".join(plan.args) + "\n")
    w("\n")


def plan_json(plan: Plan) -> dict:
    return {
        "name": plan.name,
        "namespace": plan.namespace,
        "model": plan.spec.model.name,
        "modelSource": plan.model.source if plan.model else None,
        "args": plan.args,
        "fits": plan.fits,
        "problems": [str(p) for p in plan.problems],
        "problemKinds": plan.problem_kinds(),
        "estimates": plan.estimates(),
        "decisions": [{"flag": d.flag, "value": d.value, "why": d.why, "pinned": d.pinned} for d in plan.decisions],
        "notes": plan.notes,
        "flagCheck": plan_flag_check(plan),
    }


def plan_flag_check(plan: Plan) -> Optional[dict]:
    """Which vLLM release's flags checked the args, and the warning when the check was loose."""
    check = plan.flags
    if check is None:
        return None
    return {"imageRelease": check.release, "snapshot": check.snapshot.version, "exact": check.exact,
            "unchecked": list(check.unchecked), "warning": check.warning()}


def input_files(paths: list[str]) -> list[str]:
    """The files to read: each path as given ('-' is stdin), a directory as its *.yaml and *.yml files, sorted."""
    files: list[str] = []
    for path in paths:
        if path != "-" and os.path.isdir(path):
            found = sorted(str(p) for p in Path(path).rglob("*") if p.suffix in (".yaml", ".yml") and p.is_file())
            files += found or [path]  # an empty directory is reported as having no documents
        else:
            files.append(path)
    return files


def _plans(args: argparse.Namespace, err: TextIO) -> tuple[list[tuple[str, Built]], bool]:
    """Load, plan, build and check every document of every file (pipeline.build_server, as the reconciler does);
    print document errors. Returns ([(file, built)], all_ok): each plan with its children."""
    ok, plans = True, []
    try:
        settings = hub_settings(args)
    except ValueError as exc:  # an unreadable --hf-token-file
        err.write(f"vllm-operator: {exc}\n")
        return [], False
    for path in input_files(args.file):
        found, fine = _plans_of(path, settings, args, err)
        plans += [(path, p) for p in found]
        ok = ok and fine
    return plans, ok


def _plans_of(path: str, settings: tuple[Optional[str], Union[str, bool, None]], args: argparse.Namespace,
              err: TextIO) -> tuple[list[Built], bool]:
    try:
        text = _read(path) if not os.path.isdir(path) else ""
    except OSError as exc:
        err.write(f"{path}: {exc.strerror or exc}\n")
        return [], False
    except UnicodeDecodeError as exc:
        err.write(f"{path}: not a UTF-8 text file (byte {exc.start}); expected YAML\n")
        return [], False
    ok = True
    plans = []
    docs = documents.load_documents(text)
    if not docs:
        err.write(f"{path}: no VLLMServer documents\n")
        return [], False
    for doc in docs:
        if doc.errors:
            ok = False
            for line in dict.fromkeys(doc.errors):
                err.write(f"{path}: {doc.name + ': ' if doc.name else ''}{line}\n")
            continue
        s = doc.server
        assert s is not None  # a document without errors holds its server
        namespace, why = document_namespace(s.metadata, args)
        if why is not None and namespace is None:
            err.write(f"{path}: {s.metadata.name}: {why}\n")
            ok = False
            continue
        if why is not None:
            err.write(f"{path}: {s.metadata.name}: note: {why}\n")
        assert namespace is not None
        endpoint, token = settings
        built = pipeline.build_server(s.metadata.name, namespace, s.spec, hf_endpoint=endpoint,
                                      hf_token=token, allow_unsafe_args=api.allows_unsafe_args(s.metadata),
                                      local_config=getattr(args, "model_config", None),
                                      urls=url_policy(args, endpoint))
        plans.append(built)
        ok = ok and built.plan.fits
    return plans, ok


def url_policy(args: argparse.Namespace, endpoint: Optional[str]) -> URLPolicy:
    """The URLs a spec may name, as the operator with the same settings allows them (operator_main.url_policy):
    `plan` refuses what the operator would."""
    return URLPolicy.from_settings(getattr(args, "allowed_config_url", None) or (),
                                   getattr(args, "allowed_prometheus_url", None) or (), hf_endpoint=endpoint,
                                   prometheus_url=getattr(args, "prometheus_url", None))


def kube_context_namespace(env: Optional[dict[str, str]] = None) -> Optional[str]:
    """The namespace of the kubeconfig's current context (KUBECONFIG's first file, else ~/.kube/config), as
    kubectl would use it for an object without one; None when there is none or it cannot be read."""
    kubeconfig = (os.environ if env is None else env).get("KUBECONFIG")
    path = (kubeconfig or "").split(os.pathsep)[0] or os.path.expanduser("~/.kube/config")
    try:
        with open(path, encoding="utf-8") as f:
            config = yaml.safe_load(f.read(2**20))
        current = config.get("current-context")
        context = next(c.get("context") or {} for c in config.get("contexts") or [] if c.get("name") == current)
        namespace = context.get("namespace")
    except (OSError, yaml.YAMLError, AttributeError, StopIteration, UnicodeDecodeError):
        return None
    return namespace if isinstance(namespace, str) and namespace else None


def document_namespace(metadata: api.ObjectMeta, args: argparse.Namespace) -> tuple[Optional[str], Optional[str]]:
    """The namespace a document is planned in, as `kubectl apply -f FILE [-n NS]` would create it, and a line that
    says where it came from when the document names none (None: it does), or why it is refused (namespace None:
    the document's namespace and -n differ, which kubectl refuses too)."""
    flag = getattr(args, "namespace", None)
    if "namespace" in metadata.model_fields_set:
        if flag and flag != metadata.namespace:
            return None, (f"the document's metadata.namespace {metadata.namespace!r} does not match -n {flag!r} "
                          "(kubectl refuses it too); drop one of them")
        return metadata.namespace, None
    if flag:
        return flag, None
    context = kube_context_namespace()
    if context:
        return context, (f"no metadata.namespace: planned in {context!r}, the kubeconfig's current context's "
                         "namespace, as kubectl apply would create it (-n to choose)")
    return "default", ("no metadata.namespace: planned in 'default', as kubectl apply would create it without a "
                       "namespace in the kubeconfig's context (-n to choose)")


def _problems(path: str, plan: Plan, err: TextIO) -> None:
    for problem in dict.fromkeys(str(p) for p in plan.problems):  # one line per problem
        err.write(f"{path}: {plan.name}: {problem}\n")


def cmd_plan(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    plans, ok = _plans(args, err)
    if args.output == "json":
        out.write(json.dumps([plan_json(b.plan) for _, b in plans], indent=2) + "\n")
    else:
        for _, b in plans:
            render_table(b.plan, out)
    for path, b in plans:
        _problems(path, b.plan, err)
    return 0 if ok else 1


def cmd_render(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    plans, ok = _plans(args, err)
    objects = []
    for path, b in plans:
        p = b.plan
        if p.flags is not None and (warning := p.flags.warning()):  # rendered all the same: a warning, no refusal
            err.write(f"{path}: {p.name}: warning: {warning}\n")
        if p.layout:  # maxNodes: which layout the objects below are, and why (stderr: the YAML stays whole)
            err.write(f"{path}: {p.name}: {p.layout}\n")
        if p.fits and not b.oversized:
            objects += b.children
            continue
        _problems(path, p, err)
        for line in b.oversized:
            err.write(f"{path}: {p.name}: {line}\n")
        ok = False
    if args.output == "json":
        out.write(json.dumps({"apiVersion": "v1", "kind": "List", "items": objects}, indent=2) + "\n")
    else:
        out.write(yaml.dump_all(objects, Dumper=_NoAliasDumper, sort_keys=False, width=120))
    return 0 if ok else 1


class _NoAliasDumper(yaml.SafeDumper):
    """YAML without anchors and aliases (&id001, *id001): an object used twice in a render is written twice."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def cmd_catalog(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """The built-in models and GPUs, with the facts the planner uses and where each comes from."""
    models: list[dict[str, Any]] = []
    for name in catalog.known_models():
        a = catalog.lookup_model(name)
        assert a is not None
        models.append({"name": name, "parameters": a.parameter_count, "layers": a.num_layers,
                       "context": a.max_position_embeddings})
    gpus: list[dict[str, Any]] = [{"product": g.product, "memoryGiB": round(g.memory_bytes / GiB, 2), "computeCapability":
             g.compute_capability, "fp8": g.supports_fp8, "aliases": list(g.aliases), "source": g.source}
            for g in catalog.known_gpus()]
    what = args.what
    if args.output == "json":
        out.write(json.dumps({k: v for k, v in (("models", models), ("gpus", gpus)) if what in (k, "all")},
                             indent=2) + "\n")
        return 0
    if what in ("models", "all"):
        out.write(f"{'MODEL':<48} {'PARAMS':>8} {'LAYERS':>6} {'CONTEXT':>8}\n")
        for m in models:
            params = f"{m['parameters'] / 1e9:.1f}B" if m["parameters"] else "?"
            out.write(f"{m['name']:<48} {params:>8} {m['layers']:>6} {m['context']:>8}\n")
    if what == "all":
        out.write("\n")
    if what in ("gpus", "all"):
        out.write(f"{'GPU':<34} {'MEMORY':>10} {'CC':>4} {'FP8':>4}  ALIASES\n")
        for g in gpus:
            out.write(f"{g['product']:<34} {g['memoryGiB']:>6.2f} GiB {g['computeCapability']:>4} "
                      f"{'yes' if g['fp8'] else 'no':>4}  {', '.join(g['aliases'])}\n")
    return 0


def version_text() -> str:
    from . import __version__, vllm_flags
    return (f"vllm-operator {__version__} (API {api.API_VERSION}, default vLLM {vllm_flags.VERSION}, flags checked "
            f"against vLLM {', '.join(vllm_flags.releases())}, Kubernetes >= {'.'.join(map(str, api.MIN_KUBERNETES_VERSION))})")


def cmd_crd(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    out.write(crd.crd_yaml())
    return 0


def cmd_run(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from . import operator_main

    try:
        return operator_main.run(args)
    except operator_main.UnsupportedKubernetes as e:
        err.write(f"vllm-operator: {e}\n")
        return 2


def _planning_arguments(parser: argparse.ArgumentParser) -> None:
    """plan's and render's: the documents, their namespace, a local config.json, and the operator's URL settings."""
    parser.add_argument("file", nargs="+", help="YAML files or directories of VLLMServer documents ('-' for stdin)")
    parser.add_argument("-n", "--namespace",
                        help="the namespace of documents without metadata.namespace (default: the kubeconfig's "
                        "current context's, else 'default', as kubectl apply); a document naming another is refused")
    parser.add_argument("--model-config", metavar="PATH",
                        help="a local config.json (or a model directory holding one) that gives the model's facts in "
                        "place of spec.model.configURL and the Hub; the operator reads no local files, so in the "
                        "cluster the same facts come from the catalog, configURL or spec.model.architecture")
    _hub_arguments(parser)
    _url_arguments(parser)


def _url_arguments(parser: argparse.ArgumentParser) -> None:
    """The operator's URL settings (the same flags on `run`): plan and render refuse what the operator would."""
    parser.add_argument("--prometheus-url", help="default Prometheus for autoscaling.source: Prometheus")
    parser.add_argument("--allowed-config-url", action="append", default=[], metavar="PREFIX",
                        help="a URL prefix spec.model.configURL may name, beside the public Hub and --hf-endpoint "
                             "(repeatable; '*': any http(s) URL); docs/security.md")
    parser.add_argument("--allowed-prometheus-url", action="append", default=[], metavar="PREFIX",
                        help="a URL prefix spec.autoscaling.prometheusURL may name, beside --prometheus-url "
                             "(repeatable; '*': any http(s) URL); docs/security.md")


def _hub_arguments(parser: argparse.ArgumentParser, operator: bool = False) -> None:
    parser.add_argument("--hf-endpoint",
                        help="the Hugging Face Hub (or mirror) that models outside the catalog are looked up on: "
                        f"config.json and the safetensors parameter counts (default: HF_ENDPOINT, else "
                        f"{hub.DEFAULT_ENDPOINT}; none when HF_HUB_OFFLINE=1)")
    parser.add_argument("--offline", action="store_true",
                        help="look nothing up on a Hub: facts from the catalog, spec.model.configURL, "
                        "spec.model.architecture" + ("" if operator else " and --model-config only"))
    parser.add_argument("--hf-token-file", metavar="PATH",
                        help="a file holding a Hub token for gated models, sent only to --hf-endpoint" + (
                            " (the chart mounts operator.hfTokenSecret there; never a tenant's Secret)" if operator
                            else " (default: HF_TOKEN or the token of `hf auth login`, as huggingface_hub finds it)"))


def hub_settings(args: argparse.Namespace) -> tuple[Optional[str], Union[str, bool, None]]:
    """(the Hub endpoint to look models up on, None offline; the token for it) from plan's and render's flags."""
    endpoint = hub.endpoint_setting(getattr(args, "hf_endpoint", None), getattr(args, "offline", False))
    if endpoint is None:
        return None, False
    path = getattr(args, "hf_token_file", None)
    return endpoint, hub.read_token_file(path) if path else None


def build_parser() -> argparse.ArgumentParser:
    """The vllm-operator command line: plan, render, crd, catalog and run."""
    parser = argparse.ArgumentParser(prog="vllm-operator", description=__doc__)
    parser.add_argument("--version", action="version", version=version_text())
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("plan", help="show the derived vLLM flags, memory and capacity of VLLMServer files")
    p.add_argument("-o", "--output", choices=["table", "json"], default="table")
    _planning_arguments(p)
    p.set_defaults(func=cmd_plan)

    r = sub.add_parser("render", help="print every Kubernetes object the operator would apply, as YAML or JSON")
    r.add_argument("-o", "--output", choices=["yaml", "json"], default="yaml")
    _planning_arguments(r)
    r.set_defaults(func=cmd_render)

    c = sub.add_parser("crd", help="print the VLLMServer CustomResourceDefinition")
    c.set_defaults(func=cmd_crd)

    k = sub.add_parser("catalog", help="list the built-in models and GPUs the planner knows")
    k.add_argument("what", nargs="?", choices=["models", "gpus", "all"], default="all")
    k.add_argument("-o", "--output", choices=["table", "json"], default="table")
    k.set_defaults(func=cmd_catalog)

    run = sub.add_parser("run", help="run the operator against the current kubeconfig or in-cluster config")
    _run_arguments(run)
    run.set_defaults(func=cmd_run)
    return parser


def _run_arguments(run: argparse.ArgumentParser) -> None:
    """The run command's flags: what to watch, logging, the Hub, URLs, resync and re-plan; then the metrics
    server's, the chat template checks' and HA's (in that order, as --help lists them)."""
    run.add_argument("--namespace", "-n", action="append", default=[],
                     help="watch only this namespace (repeatable); cluster-wide when omitted")
    run.add_argument("--log-format", choices=["text", "json"], default="text")
    run.add_argument("--verbose", action="store_true")
    _hub_arguments(run, operator=True)
    run.add_argument("--hf-token-repo", action="append", default=[], metavar="PREFIX",
                     help="an org (my-org) or repo id prefix (my-org/llama-) whose models the --hf-token-file token "
                          "is sent for (repeatable); every other model is looked up anonymously, so the token tells "
                          "tenants nothing of other private models (default: none); docs/security.md")
    _url_arguments(run)
    run.add_argument("--resync-seconds", type=float, default=60.0, help="periodic reconcile interval")
    run.add_argument("--replan-outdated-per-minute", type=float, default=0.0,
                     help="re-plan at most this many servers a minute whose running plan an operator upgrade changed "
                          "(0: only when a server's vllm-operator.io/replan annotation asks); docs/upgrades.md")
    _metrics_arguments(run)
    _chat_template_arguments(run)
    _peering_arguments(run)


def _metrics_arguments(run: argparse.ArgumentParser) -> None:
    """The run command's flags of its metrics and health server."""
    run.add_argument("--health-port", type=int, default=8080, help="port of /metrics, /healthz and /readyz (0: off)")
    run.add_argument("--metrics-token-file", metavar="PATH",
                     help="/metrics answers only a caller sending this file's content as a bearer token (read at "
                          "each request); docs/security.md")
    run.add_argument("--metrics-public-server-series", action="store_true",
                     help="serve the series that name each VLLMServer (namespace, name) on /metrics to callers "
                          "without the token too (off: only with --metrics-token-file and the token)")


def _chat_template_arguments(run: argparse.ArgumentParser) -> None:
    """The run command's flags that bound the chat template checks."""
    run.add_argument("--chat-template-memory-mib", type=int, default=64, metavar="MIB",
                     help="address space of the child that checks one chat template (less when the operator's "
                          "cgroup has less to spare); docs/security.md")
    run.add_argument("--chat-template-checks", type=int, default=1, choices=(1, 2),
                     help="chat templates checked at once (each in its own child)")
    run.add_argument("--chat-template-checks-per-minute", type=float, default=2.0, metavar="N",
                     help="new chat templates one VLLMServer may have checked a minute, after a burst of 3")


def _peering_arguments(run: argparse.ArgumentParser) -> None:
    """The run command's flags of kopf's cluster-wide scanning and of HA peering."""
    run.add_argument("--disable-scanning", action="store_true",
                     help="never list or watch CRDs and Namespaces cluster-wide (kopf's scanning): for namespaced "
                     "installs that have Roles only; a reinstalled CRD is then noticed on restart")
    run.add_argument("--peering", default=None, help="kopf peering name for HA (off when omitted); docs/ha.md")
    run.add_argument("--peering-priority", type=int, default=None,
                     help="this replica's peering priority (the highest live one is active); default: the oldest "
                     "replica wins")
    run.add_argument("--peering-lifetime", type=int, default=None,
                     help="seconds a replica's keep-alive holds, which bounds the takeover time (default 15)")


def main(argv: Optional[list[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    return args.func(args, sys.stdout, sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
