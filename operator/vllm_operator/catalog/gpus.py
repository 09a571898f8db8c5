"""The one home of GPU knowledge: the GPU table, and spec.gpu turned into what the pod asks the scheduler for
and the GPU memory to plan with.

One job: from gpu.product (a GFD label, an alias, a family such as H100, a cloud's accelerator
name, with GFD's -SHARED or -MIG-<profile> suffix), gpu.migProfile and gpu.labelConvention derive

- the node requirements: label keys and the exact values that select the GPUs meant
  (NVIDIA-L4, never the L4 the user wrote: GPU feature discovery labels nodes NVIDIA-L4, and
  a selector on L4 leaves the pod Pending forever),
- the extended resource the container requests (nvidia.com/gpu, or nvidia.com/mig-<profile>),
- every catalog GPU those requirements can land on, and the memory of the smallest of them.

A name that means several products (H100: SXM, PCIe, NVL) selects all of them, with node
affinity `In` because a nodeSelector cannot say "or", and the plan is sized for the one with
the least memory, so the server fits on whichever the scheduler picks. Refusing instead
would make users spell GFD's exact strings, the very mistake that left pods Pending; to get
the bigger card's memory, name it (NVIDIA-H100-NVL) or set gpu.memory.

The GPU table (gpus.yaml, each figure with the log or document it rests on) and what selects from it:
products by GFD label, alias, family or a cloud's accelerator name (`match_gpu`).

Pure: catalog data in, a GPUSelection out; problems are (field, message) data for the planner.
"""

from __future__ import annotations

import difflib
import functools
import math
import re
from dataclasses import dataclass, field
from typing import Any, Optional

from .. import api
from .models import _read_yaml


@dataclass(frozen=True)
class GPUInfo:
    """One GPU product: its memory as CUDA reports it, and what it can do."""

    product: str
    memory_bytes: int
    compute_capability: str
    supports_fp8: bool
    memory_bandwidth_gbps: Optional[float]
    source: str
    #: True when memory_bytes is the marketed size, not a figure a real device reported.
    memory_estimated: bool = False
    note: str = ""
    aliases: tuple[str, ...] = ()
    #: GKE's cloud.google.com/gke-accelerator values for this product (none: GKE does not offer it).
    gke: tuple[str, ...] = ()
    #: Karpenter's karpenter.k8s.aws/instance-gpu-name on EKS (None: no EC2 instance has it).
    karpenter: Optional[str] = None
    #: karpenter.k8s.aws/instance-gpu-memory, where two products share one Karpenter GPU name.
    karpenter_memory_mib: Optional[int] = None
    #: MIG profile -> the slice's memory in bytes (capped at memory_bytes).
    mig: tuple[tuple[str, int], ...] = ()

    def mig_memory(self, profile: str) -> Optional[int]:
        """Memory of one MIG slice of this GPU, or None when the catalog has no such profile for it."""
        return dict(self.mig).get(profile.lower())

    def label_values(self, convention: str) -> tuple[str, ...]:
        """This product's node label values under a label convention (GFD, GKE, Karpenter)."""
        if convention == "GKE":
            return self.gke
        if convention == "Karpenter":
            return (self.karpenter,) if self.karpenter else ()
        return (self.product,)


@dataclass(frozen=True)
class GPUMatch:
    """What a gpu.product value names: one catalog product, or a family of them, and GFD's suffixes."""

    products: tuple[GPUInfo, ...]
    #: The family name when the value named several products (H100), else None.
    family: Optional[str] = None
    #: GFD's -SHARED suffix: the node's GPUs are time-sliced or shared through MPS.
    shared: bool = False
    #: The MIG profile of GFD's -MIG-<profile> suffix (MIG "single" strategy), else None.
    mig_profile: Optional[str] = None


# --------------------------------------------------------------------------- GPUs
#: The node label conventions a GPU can be selected by (spec.gpu.labelConvention).
LABEL_CONVENTIONS: tuple[str, ...] = ("GFD", "GKE", "Karpenter")
_GPU_PREFIXES = ("nvidia-", "tesla-", "geforce-")
_SHARED_SUFFIX = "-shared"  # GFD's rename of nvidia.com/gpu.product under time-slicing or MPS
_MIG_SUFFIX = re.compile(r"^(?P<gpu>.+)-mig-(?P<profile>[1-9]g\.[0-9]+gb)$")  # GFD's MIG "single" strategy


def _gpu_words(name: str) -> str:
    """Lower case, spaces and underscores as dashes: how GFD writes an NVML name, case aside."""
    return "-".join(name.strip().lower().replace("_", " ").replace("-", " ").split())


def _strip_prefixes(key: str) -> str:
    stripped = True
    while stripped:
        stripped = False
        for prefix in _GPU_PREFIXES:
            if key.startswith(prefix) and len(key) > len(prefix):
                key = key[len(prefix):]
                stripped = True
    return key


def _gpu_key(product: str) -> str:
    """The lookup key of a product or alias: its words without vendor prefixes."""
    return _strip_prefixes(_gpu_words(product))


def _split_suffixes(name: str) -> tuple[str, bool, Optional[str]]:
    """(words without GFD's suffixes, -SHARED seen, MIG profile of a -MIG-<profile> suffix)."""
    words = _gpu_words(name)
    shared = words.endswith(_SHARED_SUFFIX) and len(words) > len(_SHARED_SUFFIX)
    if shared:
        words = words[: -len(_SHARED_SUFFIX)]
    mig = _MIG_SUFFIX.match(words)
    if mig:
        return mig.group("gpu"), shared, mig.group("profile")
    return words, shared, None


@dataclass(frozen=True)
class _GPUIndex:
    gpus: tuple[GPUInfo, ...]
    by_key: dict[str, GPUInfo]  # product and alias keys
    families: dict[str, tuple[str, tuple[GPUInfo, ...]]]  # key -> (name as written, products)
    by_label: dict[str, dict[str, tuple[GPUInfo, ...]]]  # convention -> lower-cased label value -> products


def _gpu_info(entry: dict[str, Any]) -> GPUInfo:
    cc = str(entry["compute_capability"])
    major, minor = (int(part) for part in cc.split("."))
    memory = int(entry.get("memory_bytes") or int(entry["memory_mib"]) * 2**20)
    mig = tuple(sorted((str(profile).lower(), min(memory, int(mib) * 2**20))
                       for profile, mib in (entry.get("mig_mib") or {}).items()))
    return GPUInfo(
        product=entry["product"],
        memory_bytes=memory,
        compute_capability=cc,
        supports_fp8=bool(entry.get("supports_fp8", (major, minor) >= (8, 9))),
        memory_bandwidth_gbps=(float(entry["memory_bandwidth_gbps"])
                               if entry.get("memory_bandwidth_gbps") is not None else None),
        source=str(entry["source"]),
        memory_estimated=bool(entry.get("memory_estimated", False)),
        note=str(entry.get("note") or "").strip(),
        aliases=tuple(str(a) for a in entry.get("aliases") or ()),
        gke=tuple(str(v) for v in entry.get("gke") or ()),
        karpenter=str(entry["karpenter"]) if entry.get("karpenter") else None,
        karpenter_memory_mib=int(entry["karpenter_memory_mib"]) if entry.get("karpenter_memory_mib") else None,
        mig=mig,
    )


@functools.cache
def _gpu_index() -> _GPUIndex:
    data = _read_yaml("gpus.yaml") or {}
    gpus = tuple(_gpu_info(entry) for entry in data.get("gpus") or [])
    by_key: dict[str, GPUInfo] = {}
    aliases: set[str] = set()
    for info in gpus:
        for name in (info.product, *info.aliases):
            key = _gpu_key(name)
            if key in by_key and by_key[key] is not info:
                raise ValueError(f"gpus.yaml: {name!r} names both {by_key[key].product} and {info.product}")
            by_key[key] = info
            if name != info.product:
                aliases.add(key)
    by_product = {info.product: info for info in gpus}
    families: dict[str, tuple[str, tuple[GPUInfo, ...]]] = {}
    for family, members in (data.get("families") or {}).items():
        key = _gpu_key(str(family))
        # A family may share its key with a product (H200, NVIDIA-H200): the exact label means the product.
        if key in aliases:
            raise ValueError(f"gpus.yaml: family {family!r} is also an alias of {by_key[key].product}")
        unknown = [m for m in members if m not in by_product]
        if unknown or len(members) < 2:
            raise ValueError(f"gpus.yaml: family {family!r} needs two or more catalog products (unknown: {unknown})")
        families[key] = (str(family), tuple(by_product[m] for m in members))
    by_label: dict[str, dict[str, tuple[GPUInfo, ...]]] = {"GFD": {_gpu_words(i.product): (i,) for i in gpus}}
    for convention in ("GKE", "Karpenter"):
        values: dict[str, tuple[GPUInfo, ...]] = {}
        for info in gpus:
            for value in info.label_values(convention):
                values[value.lower()] = values.get(value.lower(), ()) + (info,)
        by_label[convention] = values
    return _GPUIndex(gpus, by_key, families, by_label)


def match_gpu(name: str, convention: str = "GFD") -> Optional[GPUMatch]:
    """What a gpu.product value names, or None when the catalog does not know it.

    Accepted, case-insensitively, with spaces, dashes and underscores alike, in this order: a GFD
    product label (NVIDIA-L4; NVIDIA-H200 is that product, H200 the family of it and the H200 NVL),
    a value of the label convention in use (GKE's nvidia-tesla-a100, Karpenter's a10g), with any
    convention a GKE accelerator name, a family (H100: every H100 product), an alias (L4), and last
    any of these with the dashes left out (L40-S, RTX6000-Ada). GFD's "-SHARED" and
    "-MIG-<profile>" suffixes are recognised and reported.
    """
    if not name or not name.strip():
        return None
    index = _gpu_index()
    words, shared, mig = _split_suffixes(name)
    for conv in dict.fromkeys(("GFD", convention, "GKE")):
        products = index.by_label.get(conv, {}).get(words)
        if products:
            family = name.strip() if len(products) > 1 else None
            return GPUMatch(products, family, shared, mig)
    key = _strip_prefixes(words)
    if key in index.families:
        family, products = index.families[key]
        return GPUMatch(products, family, shared, mig)
    if key in index.by_key:
        return GPUMatch((index.by_key[key],), None, shared, mig)
    # Last, dashes ignored (L40-S, A100-80-GB, RTX6000-Ada), where that names one product or family.
    compact = key.replace("-", "")
    found: set[tuple[Optional[str], tuple[GPUInfo, ...]]] = {
        (family, products) for k, (family, products) in index.families.items() if k.replace("-", "") == compact}
    found |= {(None, (info,)) for k, info in index.by_key.items() if k.replace("-", "") == compact}
    if len(found) == 1:
        family, products = found.pop()
        return GPUMatch(products, family, shared, mig)
    return None


def lookup_gpu(product: str) -> Optional[GPUInfo]:
    """The catalog entry for one GPU product (nvidia.com/gpu.product value or alias), or None.

    Case-insensitive; spaces and dashes are interchangeable; "NVIDIA-", "Tesla-" and
    "GeForce-" prefixes and GFD's "-SHARED" suffix are ignored. A family (H100) and a MIG
    slice (GFD's -MIG-1g.5gb) are not one GPU and return None: see match_gpu.
    """
    match = match_gpu(product)
    if match is None or match.family is not None or match.mig_profile is not None:
        return None
    return match.products[0]


def known_gpus() -> list[GPUInfo]:
    """Every GPU in the built-in catalog."""
    return list(_gpu_index().gpus)


def gpu_families() -> dict[str, tuple[GPUInfo, ...]]:
    """Family name (as gpus.yaml writes it) -> the products it selects."""
    return {name: products for name, products in _gpu_index().families.values()}


def mig_profiles() -> dict[str, tuple[GPUInfo, ...]]:
    """Every MIG profile the catalog knows -> the GPUs that have it."""
    profiles: dict[str, tuple[GPUInfo, ...]] = {}
    for info in _gpu_index().gpus:
        for profile, _ in info.mig:
            profiles[profile] = profiles.get(profile, ()) + (info,)
    return dict(sorted(profiles.items()))


def near_gpu_names(name: str, n: int = 3) -> list[str]:
    """Catalog names close to an unknown gpu.product (difflib over products, aliases and families).

    Each suggestion is what to write: a product's GFD label (also for an alias that matched) or a
    family's name. A name that starts with a known family or product ("H100-SXM5-94GB") suggests it too.
    """
    index = _gpu_index()
    words, _, _ = _split_suffixes(name)
    key = _strip_prefixes(words)
    shown: dict[str, str] = {k: info.product for k, info in index.by_key.items()}
    shown.update({k: family for k, (family, _) in index.families.items()})
    close = difflib.get_close_matches(key, list(shown), n=2 * n, cutoff=0.7)
    head = key.split("-", 1)[0]
    if head in shown and head != key:
        close.insert(0, head)
    return list(dict.fromkeys(shown[k] for k in close))[:n]


# --------------------------------------------------------------------------- selection: spec.gpu -> node requirements, resource, memory
GiB = 2**30
GPU_RESOURCE = "nvidia.com/gpu"
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"
GFD_PRODUCT_LABEL = "nvidia.com/gpu.product"
GKE_ACCELERATOR_LABEL = "cloud.google.com/gke-accelerator"
GKE_PARTITION_LABEL = "cloud.google.com/gke-gpu-partition-size"
KARPENTER_GPU_NAME_LABEL = "karpenter.k8s.aws/instance-gpu-name"
KARPENTER_GPU_MEMORY_LABEL = "karpenter.k8s.aws/instance-gpu-memory"
#: The label each convention selects a GPU product by.
PRODUCT_LABEL = {"GFD": GFD_PRODUCT_LABEL, "GKE": GKE_ACCELERATOR_LABEL, "Karpenter": KARPENTER_GPU_NAME_LABEL}
#: How each convention's world selects shared (time-sliced, MPS) GPUs, for the refusal of GFD's -SHARED.
SHARED_HINT = {
    "GKE": "GKE marks them with cloud.google.com/gke-gpu-sharing-strategy (time-sharing or mps): put that in "
           "spec.nodeSelector",
    "Karpenter": "Karpenter cannot provision by GPU sharing: give the NodePool a label of your own and put it in "
                 "spec.nodeSelector",
}
_LABEL_VALUE = re.compile(api.LABEL_VALUE_PATTERN)


@dataclass(frozen=True)
class NodeRequirement:
    """A node label and the values it may have (one value: a nodeSelector entry; several: affinity `In`)."""

    key: str
    values: tuple[str, ...]


@dataclass(frozen=True)
class GPUSelection:
    """What the pod asks for, what it can land on, and the memory to plan with."""

    requested: Optional[str] = None
    convention: str = "GFD"
    resource: str = GPU_RESOURCE
    requirements: tuple[NodeRequirement, ...] = ()
    #: Every catalog GPU the requirements can land on (empty: unknown product, or none named).
    products: tuple[GPUInfo, ...] = ()
    mig_profile: Optional[str] = None
    #: The smallest memory among `products` (of one MIG slice with a profile); None when unknown.
    memory_bytes: Optional[int] = None
    memory_source: str = ""
    memory_estimated: bool = False
    notes: tuple[str, ...] = ()
    problems: tuple[tuple[str, str, str], ...] = ()

    @property
    def description(self) -> str:
        """For people: NVIDIA-L4, H100 (NVIDIA-H100-80GB-HBM3 | NVIDIA-H100-PCIe), ... MIG 3g.40gb."""
        values = next((r.values for r in self.requirements if r.key == GFD_PRODUCT_LABEL), ())
        if not values:
            values = tuple(g.product for g in self.products)
        if len(values) == 1:
            text = values[0]
        elif values:
            text = f"{self.requested} ({' | '.join(values)})"
        else:
            text = self.requested or "GPU"
        if self.mig_profile and f"-MIG-{self.mig_profile}" not in text:
            text += f" MIG {self.mig_profile}"
        return text


@dataclass
class _Draft:
    """The selection being built, with its notes and problems."""

    gpu: api.GPUSpec
    notes: list[str] = field(default_factory=list)
    problems: list[tuple[str, str, str]] = field(default_factory=list)
    """(field, message, reason): reason api.REASON_GPU_UNKNOWN where the catalog cannot size the GPU."""

    def problem(self, where: str, message: str, reason: str = api.REASON_INVALID_SPEC) -> None:
        self.problems.append((where, message, reason))

    def done(self, **fields) -> GPUSelection:
        return GPUSelection(requested=self.gpu.product, convention=self.gpu.label_convention,
                            notes=tuple(self.notes), problems=tuple(self.problems), **fields)


def gib(n: float) -> str:
    return f"{n / GiB:.2f} GiB"


def select_gpu(gpu: api.GPUSpec) -> GPUSelection:
    """Resolve spec.gpu. Never raises: problems name the field to change."""
    draft = _Draft(gpu)
    match = match_gpu(gpu.product, gpu.label_convention) if gpu.product else None
    mig, single = _mig_profile(draft, match)
    if mig and gpu.count > 1:
        draft.problem("spec.gpu.count", f"a MIG slice ({mig}) is one CUDA device and vLLM cannot run tensor "
                      f"parallelism across slices (no peer-to-peer between MIG instances): set count: 1 and a "
                      f"bigger profile, or use whole GPUs")
    resource = MIG_RESOURCE_PREFIX + mig if mig and not single and gpu.label_convention != "GKE" else GPU_RESOURCE
    if gpu.resource_name:  # a renamed device-plugin resource (nvidia.com/gpu.shared); the CRD keeps it off MIG
        resource = gpu.resource_name
    if not gpu.product:
        return _without_product(draft, mig, resource)
    if match is None:
        return _unknown_product(draft, mig, resource)
    return _known_product(draft, match, mig, single, resource)


def _mig_profile(draft: _Draft, match: Optional[GPUMatch]) -> tuple[Optional[str], bool]:
    """(the MIG profile, whether it came from GFD's -MIG- suffix: the device plugin's single strategy)."""
    spec_profile = draft.gpu.mig_profile.lower() if draft.gpu.mig_profile else None
    named = match.mig_profile if match else None
    if named and spec_profile and named != spec_profile:
        draft.problem("spec.gpu.migProfile", f"{draft.gpu.mig_profile} differs "
                      f"from the MIG profile in gpu.product ({named}); set one of them")
    return (named or spec_profile), named is not None


# --------------------------------------------------------------------------- no product, unknown product
def _without_product(draft: _Draft, mig: Optional[str], resource: str) -> GPUSelection:
    """Any GPU (any node with the resource): memory from gpu.memory, or the smallest slice of the profile."""
    gpu = draft.gpu
    requirements: tuple[NodeRequirement, ...] = ()
    products: tuple[GPUInfo, ...] = ()
    if mig:
        products = mig_profiles().get(mig, ())
        if gpu.label_convention == "GKE":
            requirements = (NodeRequirement(GKE_PARTITION_LABEL, (mig,)),)
    memory, source, estimated = _smallest(products, mig)
    if memory is None and gpu.memory is None:
        if mig:
            known = ", ".join(mig_profiles())
            draft.problem("spec.gpu.memory", f"no catalog GPU has MIG profile {mig} (known: {known}); set "
                          f"gpu.product, or gpu.memory to the slice's memory (nvidia-smi mig -lgip shows it)",
                          api.REASON_GPU_UNKNOWN)
        else:
            draft.problem("spec.gpu.memory", "no gpu.product: set gpu.product (NVIDIA-L4, L4, H100, ...) or "
                          "gpu.memory to one GPU's memory (for example 24Gi)", api.REASON_GPU_UNKNOWN)
    return draft.done(resource=resource, requirements=requirements, products=products, mig_profile=mig,
                      memory_bytes=memory, memory_source=source, memory_estimated=estimated)


def _unknown_product(draft: _Draft, mig: Optional[str], resource: str) -> GPUSelection:
    """Open world: a product the catalog does not know is selected as written, if gpu.memory says its size."""
    gpu = draft.gpu
    product = str(gpu.product).strip()
    near = near_gpu_names(product)
    hint = f" (did you mean {_either(near)}?)" if near else ""
    if gpu.memory is None:
        example = _example_memory(near, product)
        draft.problem("spec.gpu.product", f"{product!r} is not a GPU the catalog knows{hint}. gpu.product takes a "
                      f"GPU feature discovery label (NVIDIA-L4), an alias (L4, A100-80GB) or a family (H100); to "
                      f"keep this name, set gpu.memory to one GPU's memory (for example {example})",
                      api.REASON_GPU_UNKNOWN)
        return draft.done(resource=resource, mig_profile=mig)
    value = "-".join(product.split()) if gpu.label_convention == "GFD" else product  # GFD: NVML spaces as dashes
    if len(value) > 63 or not _LABEL_VALUE.match(value):
        draft.problem("spec.gpu.product", f"{product!r} is not a Kubernetes label value (at most 63 letters, digits, "
                      "'-', '_' or '.'), so no node can carry it")
        return draft.done(resource=resource, mig_profile=mig)
    key = PRODUCT_LABEL[gpu.label_convention]
    capitals = (" (GFD keeps NVML's capitals: NVIDIA-L4, not nvidia-l4)"
                if value.islower() and key == GFD_PRODUCT_LABEL else "")
    draft.notes.append(f"gpu.product {product!r} is not in the catalog: nodes are selected by {key}={value} as "
                       f"written{capitals}{hint}, and planned with gpu.memory {gpu.memory}")
    requirements = [NodeRequirement(key, (value,))]
    if mig and gpu.label_convention == "GKE":
        requirements.append(NodeRequirement(GKE_PARTITION_LABEL, (mig,)))
    return draft.done(resource=resource, requirements=tuple(requirements), mig_profile=mig)


def _either(names: list[str]) -> str:
    return " or ".join(", ".join(names).rsplit(", ", 1)) if len(names) > 1 else names[0]


def _example_memory(near: list[str], product: str) -> str:
    """A gpu.memory example for the product: from the size in its name, else the nearest catalog name's."""
    size = re.search(r"(\d+)\s*GB\b", product, re.IGNORECASE)
    if size and int(size.group(1)) > 1:
        return f"{int(size.group(1)) - 1}Gi for a card sold as {size.group(1)} GB: CUDA reports a little less"
    for name in near:
        match = match_gpu(name)
        if match is not None:
            smallest = min(match.products, key=lambda g: g.memory_bytes)
            return f"{math.floor(smallest.memory_bytes / GiB)}Gi, as {smallest.product} reports it"
    return "24Gi"


# --------------------------------------------------------------------------- catalog products
def _known_product(draft: _Draft, match: GPUMatch, mig: Optional[str], single: bool, resource: str) -> GPUSelection:
    gpu = draft.gpu
    convention = gpu.label_convention
    if match.shared and convention != "GFD":
        draft.problem("spec.gpu.product", f"-SHARED is the suffix GPU feature discovery adds to {GFD_PRODUCT_LABEL} "
                      f"on shared GPUs; labelConvention {convention} has no such value. {SHARED_HINT[convention]}, "
                      "or use labelConvention: GFD")
    if match.shared and gpu.count > 1:
        draft.problem("spec.gpu.count", f"{gpu.count} shares of a shared GPU (-SHARED) can be shares of one GPU: "
                      "tensor parallelism over them would run every shard on the same device. Use count: 1, or "
                      "whole GPUs for tensor parallelism")
    candidates = _with_mig(draft, match, mig)
    candidates = _with_label(draft, candidates, convention)
    if not candidates:
        return draft.done(resource=resource, mig_profile=mig)
    requirements, reach = _requirements(candidates, convention, mig, single, match.shared)
    extra = [g.product for g in reach if g not in candidates]
    if extra:
        draft.notes.append(f"{_describe(requirements)} also selects {', '.join(extra)} (the label does not tell "
                           "them apart): planned for the smallest")
    memory, source, estimated = _smallest(reach, mig)
    if memory is None and gpu.memory is None and not draft.problems:
        draft.problem("spec.gpu.memory", f"the catalog has no memory figure for MIG profile {mig} on "
                      f"{', '.join(g.product for g in reach)}; set gpu.memory to the slice's memory "
                      "(nvidia-smi mig -lgip shows it)", api.REASON_GPU_UNKNOWN)
    _explain(draft, match, requirements, reach, memory, source, estimated)
    return draft.done(resource=resource, requirements=requirements, products=reach, mig_profile=mig,
                      memory_bytes=memory, memory_source=source, memory_estimated=estimated)


def _explain(draft: _Draft, match: GPUMatch, requirements: tuple[NodeRequirement, ...], reach: tuple[GPUInfo, ...],
             memory: Optional[int], source: str, estimated: bool) -> None:
    """Notes for the plan: what the pod selects where that is not what was written, and memory caveats."""
    gpu = draft.gpu
    if len(reach) > 1:
        draft.notes.append(f"gpu.product {gpu.product} selects any of {', '.join(g.product for g in reach)} "
                           f"({_describe(requirements)}); planned for the smallest, {_short(source)}")
    elif [str(gpu.product).strip()] != [v for r in requirements for v in r.values]:
        draft.notes.append(f"gpu.product {gpu.product} selects nodes by {_describe(requirements)}")
    if gpu.memory is not None and memory is not None and api.parse_quantity(gpu.memory) > memory:
        draft.notes.append(f"gpu.memory {gpu.memory} is more than the {_short(source)}: vLLM will not start if "
                           "the GPU has less free memory than its budget")
    if estimated and gpu.memory is None:
        draft.notes.append(f"the {_short(source)} is a marketed size, not what CUDA reports: set gpu.memory to "
                           "torch.cuda.get_device_properties(0).total_memory if the server runs close")
    if match.shared and gpu.label_convention == "GFD":
        draft.notes.append("shared GPU (-SHARED): time-slicing does not divide GPU memory, so the plan takes the "
                           "whole GPU; where other pods share it, set gpu.memory to this server's share (with MPS, "
                           "memory / replicas)")


def _with_mig(draft: _Draft, match: GPUMatch, mig: Optional[str]) -> tuple[GPUInfo, ...]:
    """The matched products that have the MIG profile (all of them without one)."""
    if not mig:
        return match.products
    having = tuple(g for g in match.products if g.mig_memory(mig) is not None)
    with_tables = [g for g in match.products if g.mig]
    if having:
        if len(having) < len(match.products):
            draft.notes.append(f"{', '.join(g.product for g in match.products if g not in having)}: no MIG "
                               f"profile {mig} in the catalog, not selected")
        return having
    if with_tables:  # the catalog knows these GPUs' profiles, and this is not one of them
        profiles = sorted({p for g in with_tables for p, _ in g.mig})
        names = ", ".join(g.product for g in with_tables)
        draft.problem("spec.gpu.migProfile", f"{mig} is not a MIG profile of {names} (profiles: {', '.join(profiles)})")
        return ()
    if draft.gpu.memory is None:
        names = ", ".join(g.product for g in match.products)
        draft.problem("spec.gpu.migProfile", f"the catalog has no MIG profiles for {names}: if it has {mig}, set "
                      "gpu.memory to the slice's memory (nvidia-smi mig -lgip shows it)",
                      api.REASON_GPU_UNKNOWN)
    return match.products


def _with_label(draft: _Draft, candidates: tuple[GPUInfo, ...], convention: str) -> tuple[GPUInfo, ...]:
    """The candidates the convention has a label value for; the others cannot be selected by it."""
    labelled = tuple(g for g in candidates if g.label_values(convention))
    if candidates and not labelled:
        offered = sorted({g.product for g in known_gpus() if g.label_values(convention)})
        draft.problem("spec.gpu.labelConvention", f"{', '.join(g.product for g in candidates)} has no "
                      f"{PRODUCT_LABEL[convention]} value ({convention} offers: {', '.join(offered)}); use "
                      "labelConvention: GFD on nodes that GPU feature discovery labels")
    elif len(labelled) < len(candidates):
        dropped = [g.product for g in candidates if g not in labelled]
        draft.notes.append(f"{', '.join(dropped)}: no {PRODUCT_LABEL[convention]} value ({convention} does not offer "
                           "it), not selected")
    return labelled


def _requirements(candidates: tuple[GPUInfo, ...], convention: str, mig: Optional[str], single: bool,
                  shared: bool) -> tuple[tuple[NodeRequirement, ...], tuple[GPUInfo, ...]]:
    """The node requirements for the candidates, and every catalog GPU they can land on."""
    if convention == "GFD":
        suffix = (f"-MIG-{mig}" if single else "") + ("-SHARED" if shared else "")
        return (NodeRequirement(GFD_PRODUCT_LABEL, tuple(g.product + suffix for g in candidates)),), candidates
    values = tuple(dict.fromkeys(v for g in candidates for v in g.label_values(convention)))
    requirements = [NodeRequirement(PRODUCT_LABEL[convention], values)]
    reach = tuple(g for g in known_gpus() if set(g.label_values(convention)) & set(values))
    if convention == "Karpenter" and set(reach) != set(candidates):
        # a100 is the 40 GB and the 80 GB card; Karpenter's per-GPU memory label tells them apart.
        memories = {g.karpenter_memory_mib for g in candidates}
        known = sorted(m for m in memories if m is not None)
        if len(known) == len(memories) and all(g.karpenter_memory_mib for g in reach):
            requirements.append(NodeRequirement(KARPENTER_GPU_MEMORY_LABEL, tuple(str(m) for m in known)))
            reach = tuple(g for g in reach if g.karpenter_memory_mib in memories)
    if mig:
        reach = tuple(g for g in reach if g.mig_memory(mig) is not None) or reach
        if convention == "GKE":
            requirements.append(NodeRequirement(GKE_PARTITION_LABEL, (mig,)))
    return tuple(requirements), reach


def _describe(requirements: tuple[NodeRequirement, ...]) -> str:
    return ", ".join(f"{r.key}={r.values[0]}" if len(r.values) == 1 else f"{r.key} in ({', '.join(r.values)})"
                     for r in requirements)


def _smallest(products: tuple[GPUInfo, ...], mig: Optional[str]) -> tuple[Optional[int], str, bool]:
    """(memory, source, estimated) of the product with the least memory (of one slice with a MIG profile).

    The source reads "catalog NVIDIA-H100-PCIe: 79.11 GiB (<document>)"; _short(source) drops the document."""
    sized: list[tuple[int, GPUInfo]] = []
    for g in products:
        memory = g.mig_memory(mig) if mig else g.memory_bytes
        if memory is not None:
            sized.append((memory, g))
    if not sized:
        return None, "", False
    memory, smallest = min(sized, key=lambda item: item[0])
    what = f"{smallest.product} MIG {mig}" if mig else smallest.product
    return memory, f"catalog {what}: {gib(memory)} ({smallest.source})", smallest.memory_estimated


def _short(source: str) -> str:
    """A memory source without its document, e.g. catalog NVIDIA-H100-PCIe: 79.11 GiB."""
    return source.split(" (", 1)[0]
