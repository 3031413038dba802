"""Parse `vllm serve` argvs with vLLM's own parser; runs INSIDE the test-only venv (hack/vllm-parser-env.sh).

    <venv>/bin/python tests/versions/vllm_parse.py < argvs.json      # a JSON list of argvs, without "vllm serve"

Prints one JSON list, one object per argv, in order: the parsed engine settings the profile cares about and
`"ok": true`, or `"ok": false` with argparse's exit code and message (an unknown flag exits 2). One process parses
them all: importing vLLM and torch is the slow part (about a minute on a busy 2-core machine). No GPU: the CPU
platform is forced first, because vLLM cannot infer a device otherwise (shared/reference/vllm-argparse-on-cpu.md).
"""

from __future__ import annotations

import contextlib
import io
import json
import sys
from typing import Any


def main() -> int:
    argvs = json.load(sys.stdin)
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

    def parse(argv: list[str]) -> dict[str, Any]:
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err):
                args = make_arg_parser(FlexibleArgumentParser()).parse_args(argv)
                validate_parsed_serve_args(args)
                engine = AsyncEngineArgs.from_cli_args(args)
        except SystemExit as e:
            return {"ok": False, "exit": e.code, "error": err.getvalue()[-3000:]}
        except Exception as e:  # a validation error is a result to report, not a crash
            return {"ok": False, "exit": None, "error": f"{type(e).__name__}: {e}"[-3000:]}
        kv = engine.kv_transfer_config
        return {
            **_parallel(engine, args),
            "ok": True,
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
            "enforce_eager": engine.enforce_eager,
            "load_format": str(engine.load_format),
            "skip_tokenizer_init": engine.skip_tokenizer_init,
            "max_num_seqs": engine.max_num_seqs,
            "revision": engine.revision,
            "kv_connector": getattr(kv, "kv_connector", None),
            "kv_role": getattr(kv, "kv_role", None),
            "kv_load_failure_policy": getattr(kv, "kv_load_failure_policy", None),
        }

    def _parallel(engine: Any, args: Any) -> dict[str, Any]:
        """The parallel layout as vLLM reads it; for a multi-node argv also vLLM's own ParallelConfig built from it
        (its validators run on the CPU platform: world size, each node's ranks, the executor)."""
        out: dict[str, Any] = {
            "pipeline_parallel_size": engine.pipeline_parallel_size,
            "nnodes": engine.nnodes,
            "node_rank": engine.node_rank,
            "master_addr": engine.master_addr,
            "master_port": engine.master_port,
            "distributed_executor_backend": engine.distributed_executor_backend,
            "headless": bool(getattr(args, "headless", False)),
        }
        if engine.nnodes > 1:
            from vllm.config import ParallelConfig

            pc = ParallelConfig(
                tensor_parallel_size=engine.tensor_parallel_size,
                pipeline_parallel_size=engine.pipeline_parallel_size,
                nnodes=engine.nnodes,
                node_rank=engine.node_rank,
                master_addr=engine.master_addr,
                master_port=engine.master_port,
                distributed_executor_backend=engine.distributed_executor_backend,
            )
            out.update(world_size=pc.world_size, local_world_size=pc.local_world_size,
                       backend=str(pc.distributed_executor_backend))  # fmt: skip
        return out

    out = {"vllm_version": __import__("vllm").__version__, "results": [parse(a) for a in argvs]}
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
