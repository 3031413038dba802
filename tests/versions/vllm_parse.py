"""Parse a `vllm serve` argv with vLLM's own parser; runs INSIDE the test-only venv (hack/vllm-parser-env.sh).

    <venv>/bin/python tests/versions/vllm_parse.py < argv.json      # argv without the leading "vllm serve"

Prints one JSON object with the parsed engine settings the profile cares about. Exit 2 on a parser error
(argparse's own exit code, with its message on stderr). No GPU: the CPU platform is forced first, because
vLLM cannot infer a device otherwise (shared/reference/vllm-argparse-on-cpu.md).
"""

from __future__ import annotations

import json
import sys


def main() -> int:
    argv = json.load(sys.stdin)
    from vllm import platforms
    from vllm.platforms.cpu import CpuPlatform

    platforms._current_platform = CpuPlatform()

    from vllm.engine.arg_utils import AsyncEngineArgs

    try:
        from vllm.entrypoints.openai.cli_args import make_arg_parser, validate_parsed_serve_args
    except ModuleNotFoundError:  # 0.33 moved the serve CLI args
        from vllm.entrypoints.common.cli_args import (  # type: ignore[no-redef]
            make_arg_parser,
            validate_parsed_serve_args,
        )
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = make_arg_parser(FlexibleArgumentParser())
    args = parser.parse_args(argv)
    validate_parsed_serve_args(args)
    engine = AsyncEngineArgs.from_cli_args(args)
    kv = engine.kv_transfer_config
    out = {
        "vllm_version": __import__("vllm").__version__,
        "model": engine.model,
        "served_model_name": engine.served_model_name,
        "port": args.port,
        "tensor_parallel_size": engine.tensor_parallel_size,
        "block_size": engine.block_size,
        "max_model_len": engine.max_model_len,
        "dtype": engine.dtype,
        "gpu_memory_utilization": engine.gpu_memory_utilization,
        "enable_prefix_caching": engine.enable_prefix_caching,
        "disable_hybrid_kv_cache_manager": engine.disable_hybrid_kv_cache_manager,
        "async_scheduling": engine.async_scheduling,
        "kv_connector": getattr(kv, "kv_connector", None),
        "kv_role": getattr(kv, "kv_role", None),
        "kv_load_failure_policy": getattr(kv, "kv_load_failure_policy", None),
    }
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
