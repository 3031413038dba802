"""vLLM's own load generator, `vllm bench serve`, kept in one process for a series of runs (bench/load/run_load.py
drives it; importing vLLM costs 10-40 s, which a sweep would otherwise pay per point).

Each stdin line is JSON `{"id": N, "argv": [...]}`, where argv is exactly what follows `vllm bench serve` on a command
line. It is parsed by the parser `vllm bench serve` builds (vLLM's FlexibleArgumentParser with
`vllm.benchmarks.serve.add_cli_args`, as vllm/entrypoints/cli/benchmark/serve.py does) and run by the same
`vllm.benchmarks.serve.main(args)`, after the same process setup as the `vllm` CLI (cli_env_setup, and the CPU
platform where none is detected). vLLM writes its own result JSON (`--save-result --result-dir --result-filename`).
Not the `vllm` console script itself: `vllm.entrypoints.cli.main` imports the serving stack (the OpenAI server and
its SageMaker routes) before it dispatches, which the CPU-only vLLM venv of the CI smoke test cannot import.

Protocol lines on stdout (everything else there is vLLM's own output): `HPD-BENCH ready {json}` once, then
`HPD-BENCH done ID {json}` per request, `{"ok": bool, "error": str | null, "seconds": float}`.
"""

from __future__ import annotations

import json
import sys
import time
import traceback

MARK = "HPD-BENCH"


def main() -> int:
    t0 = time.monotonic()
    import vllm
    from vllm.benchmarks.serve import add_cli_args
    from vllm.benchmarks.serve import main as bench_main
    from vllm.entrypoints.utils import cli_env_setup
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    cli_env_setup()
    from vllm import platforms

    if platforms.current_platform.is_unspecified():  # what `vllm bench ...` does (vllm/entrypoints/cli/main.py)
        from vllm.platforms.cpu import CpuPlatform

        platforms.current_platform = CpuPlatform()
    ready = {"vllm": vllm.__version__, "import_s": round(time.monotonic() - t0, 1), "python": sys.version.split()[0]}
    print(f"{MARK} ready {json.dumps(ready)}", flush=True)
    for line in sys.stdin:
        if not line.strip():
            continue
        req = json.loads(line)
        parser = FlexibleArgumentParser(prog="vllm bench serve")
        add_cli_args(parser)
        t = time.monotonic()
        status: dict[str, object] = {"ok": True, "error": None}
        try:
            bench_main(parser.parse_args(req["argv"]))
        except BaseException as exc:  # argparse exits with SystemExit; a failed run must not end the process
            status = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:2000]}
            traceback.print_exc(file=sys.stdout)
            if isinstance(exc, KeyboardInterrupt):
                raise
        status["seconds"] = round(time.monotonic() - t, 3)
        print(f"{MARK} done {req['id']} {json.dumps(status)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
