"""Serving under load, P/D against colocated, and the P->D first-token cost at concurrency 1.

Two deployments of one CR, one after the other, started from `python -m hpd_operator render -o json` output exactly
as bench/gpu/run.py starts them (imported, not copied: its HOST_SUBSTITUTIONS, our runtime's launch/warmup/readiness,
vllm-router 0.1.17):

  pd         the CR's prefill and decode behind vllm-router `--vllm-pd-disaggregation`, as run.py runs them.
  colocated  two replicas of the CR's rendered *prefill* container with `--kv-transfer-config` removed (nothing else
             changed: same flags, env, GPU memory utilization each, cache key), behind the same router binary in its
             regular mode, round robin. The prefill container because it is the plain engine (decode's also carries
             the P/D-only --no-async-scheduling and the pair check). Equal memory: 2 x one role's.

On one GPU both sides share it (label "one H200, P and D share it", or "... both colocated replicas share it" for a
colocated-only run); `--one-gpu-per-role` puts decode and the second replica on the lane's second GPU (two GPUs: one
per role / replica). Every role is a process of this host: one PID namespace (pods have one each), and the result's
`setup` says so.

Load: vLLM's own `vllm bench serve` (random dataset, bench/load/bench_serve.py keeps it in one process), the same
points with the same seeds on both sides. Per side, in order:
  probe    concurrency 1 at about 1k, 4k and 8k prompt tokens, PROBE_SAMPLES requests each after one
           warm-up: P->D through the router and colocated on decode (decode's own port) on the pd side, the router
           on the colocated side; decode's NIXL figures (vllm:nixl_* of its /metrics) for each router probe.
  sweep    SWEEPS[name]: fixed concurrencies and open-loop request rates on a mixed prompt-length distribution, and
           fixed prompt lengths at one concurrency. TTFT/TPOT/ITL/E2EL p50/p90/p99, request and token throughput,
           goodput at the SLO (TTFT <= SLO_TTFT_MS and TPOT, the mean ITL of a request, <= SLO_TPOT_MS).
The whole run keeps to `--deadline-s`: after the pd side is Ready and probed, the time left (less the colocated
side's expected start) is split evenly between the two sweeps; a point starts only if its expected seconds (Point.est_s,
on the H200) fit, and the colocated side runs the points the pd side ran, in the same order. Skipped points are listed.

`--sides pd:probe,colocated` runs the pd side's probe only (e.g. the A/B's baseline) before the colocated side.

A plan variant applies to both sides' engines like run.py's (`CR@env+NAME=VALUE`, `CR@env-NAME`, ...): e.g.
`nemotron-h-8b@env+UCX_CUDA_IPC_ENABLE_GET_ZCOPY=y` (docs/kv-path.md) before the profile renders it.

Result: `--out`/result.json, with the exact command, `setup` (machine, model, vLLM version, mode, GPUs per role as
used, shared GPU / PID namespace), every role's argv and env, every point's `vllm bench serve` command line, vLLM's
own result JSON and `requests` (sent / answered / failed) per point and in total: a point whose counts do not add up
to what it sent is recorded as failed, never summarized without its failures (`point_requests`). bench/load/plot.py
draws it. Only 127.0.0.1 is used.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "gpu"))
import result_file  # noqa: E402  (bench/gpu/result_file.py: the setup's machine, as the GPU results name it)
import run  # noqa: E402  (bench/gpu/run.py: role launching, the router, the KV transfer figures)

from hpd_runtime import contract  # noqa: E402

SLO_TTFT_MS = 2000
SLO_TPOT_MS = 50
PERCENTILES = "50,90,99"
METRICS = "ttft,tpot,itl,e2el"
COLOCATED = ("colo-a", "colo-b")
ONE_GPU_LABEL = "one H200, P and D share it"
ONE_GPU_COLOCATED_LABEL = "one H200, both colocated replicas share it"
RUNNER_MARK = "HPD-BENCH"
STOP_EST_S = 25.0
"""Expected seconds to stop one deployment (SIGTERM to every role at once; vLLM exits in seconds when idle)."""
COLOCATED_START_FACTOR = 1.25
"""The colocated side's start against the pd side's measured one: the same two sequential engine starts, on the
prefill's cache key (Triton and Inductor caches warm from it), but vLLM's own compile hash differs (it counts
whether a kv_transfer_config is set), so its graphs are traced again."""


@dataclass(frozen=True)
class Point:
    """One `vllm bench serve` run. `x` is its position on its family's plot axis; `est_s` the seconds it is
    expected to take on the H200 (nemotron-h-8b; the skip rule of the time budget)."""

    name: str
    family: str  # warmup | concurrency | rate | length | probe
    x: float
    input_len: int
    output_len: int
    num_prompts: int
    seed: int
    est_s: float
    range_ratio: str = "0.0"
    max_concurrency: int | None = None
    request_rate: float | None = None
    warmups: int = 0
    detailed: bool = False


MIXED = {"input_len": 4096, "output_len": 192, "range_ratio": '{"input": 0.75, "output": 0.33}'}
"""The mixed distribution: prompts uniform in 1,024-7,168 tokens, outputs in 128-256 (vLLM's random dataset)."""


def _mixed(name: str, family: str, x: float, *, n: int, seed: int, est: float, **load: Any) -> Point:
    return Point(name, family, x, num_prompts=n, seed=seed, est_s=est, **MIXED, **load)


def _length(tokens: int, n: int, seed: int, est: float) -> Point:
    return Point(f"len{tokens // 1024}k-c16", "length", tokens, tokens, 128, n, seed, est, max_concurrency=16)


SWEEPS: dict[str, list[Point]] = {
    # In priority order (a point that does not fit the time left is skipped, the rest still run). Expected seconds on
    # the H200 from arithmetic, not yet measured: prefill ~20k tokens/s, decode steps ~8-12 ms, P and D on one GPU.
    "h200": [
        _mixed("warmup-c16", "warmup", 16, n=16, seed=27000, est=8, max_concurrency=16),
        _mixed("mixed-c16", "concurrency", 16, n=48, seed=27001, est=15, max_concurrency=16),
        _length(8192, 32, 27002, 15),
        _length(1024, 32, 27003, 6),
        _mixed("mixed-r4", "rate", 4, n=32, seed=27004, est=14, request_rate=4),
        _mixed("mixed-c32", "concurrency", 32, n=64, seed=27005, est=18, max_concurrency=32),
        _mixed("mixed-r8", "rate", 8, n=40, seed=27006, est=15, request_rate=8),
        _mixed("mixed-c4", "concurrency", 4, n=16, seed=27007, est=11, max_concurrency=4),
        _length(4096, 32, 27008, 9),
        _mixed("mixed-r2", "rate", 2, n=24, seed=27009, est=15, request_rate=2),
        _mixed("mixed-c1", "concurrency", 1, n=4, seed=27010, est=10, max_concurrency=1),
    ],
    # The CI smoke test (tests/versions/test_load_smoke_vllm.py): the CPU stand-in for vLLM, seconds.
    "smoke": [
        Point("mixed-c2", "concurrency", 2, 96, 12, 6, 27101, 5, '{"input": 0.5, "output": 0.33}', max_concurrency=2),
        Point("mixed-r20", "rate", 20, 96, 12, 6, 27102, 5, '{"input": 0.5, "output": 0.33}', request_rate=20),
        Point("len64-c2", "length", 64, 64, 8, 4, 27103, 5, max_concurrency=2),
    ],
}
PROBES: dict[str, list[Point]] = {
    "h200": [
        Point(f"probe-{n // 1024}k", "probe", n, n, 16, 5, 26000 + i, 4, max_concurrency=1, warmups=1, detailed=True)
        for i, n in enumerate((1024, 4096, 8192))
    ],
    "smoke": [
        Point(f"probe-{n}", "probe", n, n, 4, 2, 26100 + i, 3, max_concurrency=1, warmups=1, detailed=True)
        for i, n in enumerate((64, 256))
    ],
}
PROBE_SAMPLES = 5


def bench_argv(
    p: Point, *, base_url: str, model: str, tokenizer: Path, result_dir: Path, filename: str, label: str
) -> list[str]:
    """The `vllm bench serve` arguments of one point (vLLM 0.20's flags)."""
    argv = [
        "--backend", "openai", "--base-url", base_url, "--endpoint", "/v1/completions",
        "--model", model, "--tokenizer", str(tokenizer),
        "--dataset-name", "random", "--random-input-len", str(p.input_len), "--random-output-len", str(p.output_len),
        "--random-range-ratio", p.range_ratio, "--num-prompts", str(p.num_prompts), "--seed", str(p.seed),
        "--ignore-eos", "--temperature", "0", "--num-warmups", str(p.warmups),
        "--percentile-metrics", METRICS, "--metric-percentiles", PERCENTILES,
        "--goodput", f"ttft:{SLO_TTFT_MS}", f"tpot:{SLO_TPOT_MS}",
        "--save-result", "--result-dir", str(result_dir), "--result-filename", filename,
        "--label", label, "--metadata", f"point={p.name}", f"family={p.family}", "--disable-tqdm",
    ]  # fmt: skip
    if p.max_concurrency is not None:
        argv += ["--max-concurrency", str(p.max_concurrency)]
    if p.request_rate is not None:
        argv += ["--request-rate", str(p.request_rate)]
    if p.detailed:
        argv += ["--save-detailed"]
    return argv


# --- process bookkeeping ----------------------------------------------------------------------------------------------
def proc_start(pid: int) -> str | None:
    """The process's start time in clock ticks (/proc/PID/stat field 22): with the pid, it names one process."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[19]
    except (OSError, IndexError):
        return None


def children(pid: int) -> list[int]:
    """The direct children of `pid` (every vLLM our runtime's launcher starts leads its own session)."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()
        except OSError:
            continue
        if fields and int(fields[1]) == pid:
            out.append(int(stat.parent.name))
    return out


def descendants(pid: int) -> list[int]:
    """Children, grandchildren, ...: vLLM's API server and its EngineCore under a launcher."""
    out, todo = [], [pid]
    while todo:
        kids = children(todo.pop())
        out += kids
        todo += kids
    return out


def kill(pid: int) -> bool:
    """SIGKILL to the group `pid` leads, else to the process alone; False if it was gone."""
    try:
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:  # not a group leader: the process itself
            os.kill(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        return False
    return True


class Reaper:
    """Every process group this run starts (roles, their vLLMs, routers, the load generator), by pid and start time,
    in `--work`/pgids: vLLM and our launcher lead their own sessions, so a run cut short (the outer time limit) would
    leave engines holding the GPU; `reap` kills what is left of exactly those, here at the end and from
    bench/gpu/load-burst.sh at the start of the next call on the machine."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def note(self, pid: int) -> None:
        if (start := proc_start(pid)) is not None:
            with self.path.open("a") as fh:
                fh.write(f"{pid} {start}\n")

    def note_role(self, role: run.Role) -> list[int]:
        """The role's launcher and every process under it (vLLM, its EngineCore); returns those under it."""
        if role.proc is None:
            return []
        kids = descendants(role.proc.pid)
        for pid in (role.proc.pid, *kids):
            self.note(pid)
        return kids


def reap(path: Path) -> list[int]:
    """SIGKILL to each process group listed in `path` whose leader is still the process that was listed."""
    killed = []
    for line in dict.fromkeys(path.read_text().splitlines() if path.exists() else []):
        pid, _, start = line.partition(" ")
        if running(int(pid)) and proc_start(int(pid)) == start and kill(int(pid)):
            killed.append(int(pid))
    return killed


def running(pid: int) -> bool:
    """Exists and is not a zombie (a killed child of a killed parent waits for init to reap it)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def wait_gone(pids: list[int], timeout: float) -> list[int]:
    deadline = time.monotonic() + timeout
    while (alive := [p for p in pids if running(p)]) and time.monotonic() < deadline:
        time.sleep(0.5)
    return alive


# --- the load generator process -----------------------------------------------------------------------------------
class BenchRunner:
    """bench_serve.py as a child: one `vllm bench serve` run per request, vLLM imported once."""

    def __init__(self, python: str, log: Path, env: dict[str, str], reaper: Reaper) -> None:
        self.python, self.log_path, self.env, self.reaper = python, log, env, reaper
        self.seq = 0
        self.ready: dict[str, Any] | None = None
        self._start()

    def _start(self) -> None:
        self.lines: queue.Queue[str] = queue.Queue()
        self.proc = subprocess.Popen(
            [self.python, str(HERE / "bench_serve.py")], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, env=self.env, text=True, bufsize=1, start_new_session=True,
        )  # fmt: skip
        self.reaper.note(self.proc.pid)
        threading.Thread(target=self._read, args=(self.proc, self.lines), daemon=True).start()

    def _read(self, proc: subprocess.Popen[str], lines: queue.Queue[str]) -> None:
        """One process's output: all of it to the log, the protocol lines to its own queue."""
        assert proc.stdout is not None
        with self.log_path.open("a") as log:
            for line in proc.stdout:
                log.write(line)
                log.flush()
                if line.startswith(RUNNER_MARK):
                    lines.put(line.strip())
        lines.put(f"{RUNNER_MARK} exited {proc.wait()}")

    def _wait(self, prefix: str, timeout: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no '{prefix}' from bench_serve.py in {timeout:.0f} s")
            try:
                line = self.lines.get(timeout=left)
            except queue.Empty:
                continue
            if line.startswith(f"{RUNNER_MARK} exited"):
                raise RuntimeError(f"bench_serve.py exited with {line.split()[-1]}; see {self.log_path.name}")
            if line.startswith(prefix):
                return dict(json.loads(line[len(prefix) :]))

    def wait_ready(self, timeout: float) -> dict[str, Any]:
        if self.ready is None:
            self.ready = self._wait(f"{RUNNER_MARK} ready ", timeout)
        return self.ready

    def run(self, argv: list[str], timeout: float) -> dict[str, Any]:
        self.seq += 1
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(json.dumps({"id": self.seq, "argv": argv}) + "\n")
            self.proc.stdin.flush()
            return self._wait(f"{RUNNER_MARK} done {self.seq} ", timeout)
        except (TimeoutError, OSError, RuntimeError) as exc:  # a hung or dead run: start a fresh process
            self.close()
            self.ready = None
            self._start()
            return {"ok": False, "error": f"{type(exc).__name__}: {exc}"}

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


# --- deployments ------------------------------------------------------------------------------------------------------
def colocated_roles(
    manifests: list[dict[str, Any]], cr: str, model_dir: Path, cache_root: Path, spread: bool
) -> tuple[dict[str, run.Role], list[str]]:
    """Two replicas of the CR's rendered prefill container without --kv-transfer-config (run.py's substitutions
    plus each replica's own ports)."""
    base = run.role_commands(manifests, cr, model_dir, cache_root)["prefill"]
    roles: dict[str, run.Role] = {}
    for i, name in enumerate(COLOCATED):
        argv = list(base.argv)
        k = argv.index("--kv-transfer-config")
        del argv[k : k + 2]
        run._set_arg(argv, "--port", str(run.PORTS[name]["vllm"]))
        env = dict(base.env)
        env[contract.ENV_VLLM_PORT] = str(run.PORTS[name]["vllm"])
        env[contract.ENV_RUNTIME_PORT] = str(run.PORTS[name]["runtime"])
        if spread and i:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in run.GPUS[base.tp : 2 * base.tp])
        roles[name] = run.Role(name, argv, env, base.tp)
    notes = [
        "colocated replica = the CR's rendered prefill container (HPD_ROLE=prefill: its cache key, no pair check) "
        "with --kv-transfer-config and its value removed; nothing else changed (VLLM_NIXL_SIDE_CHANNEL_* stay: "
        "vLLM hashes them into its compile key, no connector reads them)",
        "each replica's --port, HPD_VLLM_PORT and HPD_RUNTIME_PORT: its own (one host)",
    ]
    return roles, notes


def spread_roles(roles: dict[str, run.Role]) -> None:
    """--one-gpu-per-role: decode on the lane's GPUs after prefill's."""
    d = roles["decode"]
    d.env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in run.GPUS[roles["prefill"].tp : roles["prefill"].tp + d.tp])


class Deployment:
    def __init__(
        self, side: str, roles: dict[str, run.Role], out: Path, base_env: dict[str, str], reaper: Reaper
    ) -> None:
        self.side, self.roles, self.out, self.base_env, self.reaper = side, roles, out, base_env, reaper
        self.router: run.Router | None = None
        self.t_started = 0.0
        self.engines: dict[str, list[int]] = {}

    def start(self, deadline: float) -> dict[str, Any]:
        """Engines one after the other (the next once the previous has allocated its KV cache, as run.py does, so
        vLLM's memory profiling sees only its own), then Ready on all, then the router."""
        t0 = time.monotonic()
        names = list(self.roles)
        for i, name in enumerate(names):
            run.start_role(self.roles[name], self.out, self.side, self.base_env)
            self.note(name)
            if i < len(names) - 1:
                run.wait_kv_allocated(self.roles[name], time.perf_counter() + max(deadline - time.monotonic(), 1))
                self.note(name)
        run.wait_ready(self.roles, time.perf_counter() + max(deadline - time.monotonic(), 1))
        for name in names:
            self.note(name)
        workers = None if self.side == "pd" else names
        self.router = run.Router(self.out, self.side, self.base_env, workers=workers)
        self.reaper.note(self.router.proc.pid)
        self.t_started = time.monotonic() - t0
        return {
            "start_s": round(self.t_started, 1),
            "times": {n: {"to_health_s": round(r.t_health or -1, 1), "to_readyz_s": round(r.t_ready or -1, 1)}
                      for n, r in self.roles.items()},
            "warmup": {n: [{k: e.get(k) for k in ("seconds", "pair_fault")} for e in run.runtime_events(r, "warmup_finished")]
                       for n, r in self.roles.items()},
            "pair_check_at_ready": [{k: e.get(k) for k in ("ok", "summary", "seconds")}
                                    for e in run.runtime_events(self.roles["decode"], "pair_check")]
            if "decode" in self.roles else None,
            "router_argv": self.router.argv,
            "gpu_memory": gpu_memory(),
            "kv_cache": {n: kv_cache_lines(r) for n, r in self.roles.items()},
            "block_sizes": run.block_sizes(self.roles),
        }  # fmt: skip

    def alive(self) -> str | None:
        for name, r in self.roles.items():
            if r.proc is not None and r.proc.poll() is not None:
                return f"{name} exited with {r.proc.returncode}"
        return None

    def note(self, name: str) -> None:
        self.engines[name] = sorted({*self.engines.get(name, []), *self.reaper.note_role(self.roles[name])})

    def stop(self) -> dict[str, Any]:
        """Every role at once (one SIGTERM each, run.stop_role); a vLLM still up after that (its launcher killed at
        the grace's end) is killed, so the next side's engines find the GPU memory free."""
        if self.router is not None:
            self.router.stop()
        for name in self.roles:
            self.note(name)
        codes: dict[str, int | None] = {}
        threads = [threading.Thread(target=lambda n=n, r=r: codes.__setitem__(n, run.stop_role(r, 45)))
                   for n, r in self.roles.items()]  # fmt: skip
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        out: dict[str, Any] = {"exit_codes_after_sigterm": codes}
        engines = [p for pids in self.engines.values() for p in pids]
        if left := wait_gone(engines, 10):
            out["engines_killed"] = [p for p in left if kill(p)]
            out["engines_still_up"] = wait_gone(left, 20)
        out["gpu_memory_after"] = wait_gpu_free(30)
        return out


KV_CACHE_LINE = re.compile(
    r"(Available KV cache memory: [^\n]*|GPU KV cache size: [^\n]*|Maximum concurrency for [^\n]*)"
)


def kv_cache_lines(role: run.Role) -> list[str]:
    """vLLM's own lines on the memory it kept for the KV cache (equal hardware on both sides: read them side by side;
    an engine that profiled while its neighbour warmed up can have a few GB less)."""
    return [m.group(1).strip() for m in KV_CACHE_LINE.finditer(run.log_text(role))][:6] if role.log else []


def wait_gpu_free(timeout: float, below_mib: int = 4096) -> str:
    """After a side stops: until the lane's GPUs hold less than `below_mib` each (the next side's engines check the
    free memory at start), at most `timeout` s; returns nvidia-smi's last reading."""
    deadline = time.monotonic() + timeout
    while True:
        reading = gpu_memory()
        used = {}
        for ln in reading.splitlines():
            parts = [x.strip().split()[0] for x in ln.split(",")]
            if len(parts) == 3 and parts[0].isdigit() and parts[1].isdigit():
                used[int(parts[0])] = int(parts[1])
        if not used or all(used.get(g, 0) < below_mib for g in run.GPUS) or time.monotonic() > deadline:
            return reading
        time.sleep(1)


def gpu_memory() -> str:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=index,memory.used,memory.total", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=15, check=False)  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return "nvidia-smi not available"
    return out.stdout.strip()


# --- measurements -------------------------------------------------------------------------------------------------
def model_geometry(model_dir: Path) -> str:
    """Layers by kind and hidden size from the model's config.json (Nemotron-H's hybrid_override_pattern: M = Mamba2,
    * = attention, - = MLP), and whether the weights are vLLM's dummy ones."""
    try:
        c = json.loads((model_dir / "config.json").read_text())
    except (OSError, ValueError):
        return "config.json not readable"
    pat = str(c.get("hybrid_override_pattern", ""))
    kinds = f"{pat.count('M')} Mamba2 + {pat.count('*')} attention + {pat.count('-')} MLP, " if pat else ""
    weights = "weights" if any(model_dir.glob("*.safetensors")) else "dummy weights"
    return f"{c.get('num_hidden_layers')} layers, {kinds}hidden {c.get('hidden_size')}; {weights}"


def url(port: int) -> str:
    return f"http://127.0.0.1:{port}"


def scrape_nixl() -> dict[str, float]:
    status, body = run.get(f"{url(run.PORTS['decode']['vllm'])}/metrics", 5.0)
    return run.nixl_metric_sums(body) if status == 200 else {}


class Side:
    """One side's runs: each point through the load generator, its command and vLLM's result kept."""

    def __init__(
        self, name: str, runner: BenchRunner, *, model: str, tokenizer: Path, work: Path, record: dict[str, Any],
        save: Callable[[], None],
    ) -> None:  # fmt: skip
        self.name, self.runner, self.model, self.tokenizer = name, runner, model, tokenizer
        self.dir = work / f"bench-{name}"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.record, self.save = record, save

    def one(self, p: Point, target: str, base_url: str, end: float, nixl: bool = False) -> dict[str, Any]:
        filename = f"{self.name}-{target}-{p.name}.json"
        argv = bench_argv(p, base_url=base_url, model=self.model, tokenizer=self.tokenizer, result_dir=self.dir,
                          filename=filename, label=f"{self.name}-{target}")  # fmt: skip
        before = scrape_nixl() if nixl else None
        t = time.monotonic()
        # a point starts only if its expected seconds fit before `end`: it may overrun them 4x, but not `end` by 10 s
        status = self.runner.run(argv, timeout=max(min(4 * p.est_s + 60, end - time.monotonic() + 10), 20))
        row: dict[str, Any] = {"point": asdict(p), "target": target, "seconds": round(time.monotonic() - t, 1),
                               "command": "vllm bench serve " + shlex.join(argv), "status": status}  # fmt: skip
        path = self.dir / filename
        if status.get("ok") and path.exists():
            row["result"] = json.loads(path.read_text())
        try:
            row["requests"] = point_requests(row)
        except ValueError as exc:  # counts that hide failures: the point is failed, its result kept for a reader
            row["status"] = {**status, "ok": False, "error": str(exc)}
            row["requests"] = {"sent": p.num_prompts, "answered": 0, "failed": p.num_prompts}
        if before is not None:
            row["nixl"] = run.nixl_delta(before, scrape_nixl())
        return row

    def probe(self, points: list[Point], targets: list[tuple[str, str]], end: float) -> None:
        rows = self.record.setdefault("probe", [])
        for p in points:
            for target, base_url in targets:
                if time.monotonic() + p.est_s > end:
                    self.record.setdefault("skipped", []).append(f"{p.name}@{target}: out of time")
                    continue
                rows.append(self.one(p, target, base_url, end, nixl=target == "router" and self.name == "pd"))
                self.save()

    def sweep(self, points: list[Point], base_url: str, end: float, alive: Callable[[], str | None]) -> list[str]:
        rows = self.record.setdefault("points", [])
        ran: list[str] = []
        for p in points:
            if (why := alive()) is not None:
                self.record.setdefault("skipped", []).append(f"{p.name}: {why}")
                continue
            if time.monotonic() + p.est_s > end:
                self.record.setdefault("skipped", []).append(f"{p.name}: out of time ({p.est_s:.0f} s expected)")
                continue
            rows.append(self.one(p, "router", base_url, end))
            ran.append(p.name)
            self.save()
        return ran


def point_requests(row: dict[str, Any]) -> dict[str, int]:
    """Requests sent / answered / failed at one point (vLLM's `completed` and `failed`; warm-up requests are not
    counted). A run with no result sent them all and got no answer; counts that do not add up to the point's
    `num_prompts` raise: a summary must never drop failures silently."""
    n = int(row["point"]["num_prompts"])
    r = row.get("result")
    if not r:
        return {"sent": n, "answered": 0, "failed": n}
    ok, bad = r.get("completed"), r.get("failed")
    if not (isinstance(ok, int) and isinstance(bad, int)) or ok + bad != n:
        raise ValueError(f"{row['point']['name']}: vLLM's result counts {ok} completed + {bad} failed of {n} sent")
    return {"sent": n, "answered": ok, "failed": bad}


def request_totals(report: dict[str, Any]) -> dict[str, int]:
    """The file's `requests`: the sum over every probe and sweep point of every side."""
    rows = [r for rec in report["sides"].values() for r in rec.get("probe", []) + rec.get("points", [])]
    return {k: sum(r["requests"][k] for r in rows if "requests" in r) for k in ("sent", "answered", "failed")}


def setup_record(
    *,
    gpus: str,
    model: str,
    vllm: str | None,
    sides: list[str],
    roles: dict[str, dict[str, Any]],
    topology: str = "host",
) -> dict[str, Any]:
    """The result's `setup` (the fields tests/unit/test_bench_results.py asks of every result): the machine from
    nvidia-smi's names, GPUs per role from each role's CUDA_VISIBLE_DEVICES as started."""
    per_role = {n: [int(g) for g in r["env"].get("CUDA_VISIBLE_DEVICES", "").split(",") if g.strip()]
                for n, r in roles.items()}  # fmt: skip
    used = [set(g) for g in per_role.values()]
    argvs = [r["argv"] for r in roles.values()]
    return {
        "machine": result_file.machine(gpus),
        "model": model,
        "vllm_version": vllm,
        "mode": "eager" if all("--enforce-eager" in a for a in argvs) else "compile",
        "gpus_per_role": per_role,
        "roles_share_gpu": bool(used) and bool(set.intersection(*used)),
        # how each role was isolated (bench/gpu/isolation.py, --topology): the PID namespace decides cuda_ipc
        "topology": topology,
        "roles_share_pid_namespace": run.isolation.TOPOLOGIES[topology].roles_share_pid_namespace,
        "sides": sides,
    }


def summary_row(row: dict[str, Any]) -> dict[str, Any]:
    r = row.get("result") or {}
    keys = [f"p{q}_{m}_ms" for m in ("ttft", "itl", "tpot") for q in PERCENTILES.split(",")]
    return {"point": row["point"]["name"], "target": row["target"], "ok": bool(row["status"].get("ok")),
            **(row.get("requests") or point_requests(row)),
            **{k: round(r[k], 1) for k in keys if isinstance(r.get(k), (int, float))},
            **{k: round(r[k], 3) for k in ("request_throughput", "output_throughput", "total_token_throughput",
                                           "request_goodput") if isinstance(r.get(k), (int, float))}}  # fmt: skip


def sweep_end(now: float, end: float, *, next_side: bool, side_start_s: float | None, probe_s: float) -> float:
    """When this side's sweep must stop, `end` being when this side must start stopping: then if no side follows;
    else half of what is left once the next side's expected start, probe and stop are set aside (the next side's
    sweep gets the other half). `probe_s`: the next side's probe seconds."""
    if not next_side:
        return end
    reserve = COLOCATED_START_FACTOR * (side_start_s or 150.0) + probe_s + STOP_EST_S
    return now + max((end - now - reserve) / 2, 0.0)


# --- driver -----------------------------------------------------------------------------------------------------------
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rendered", type=Path, required=True, help="`python -m hpd_operator render -o json` output")
    ap.add_argument("--cr", required=True, help="CR[@variant], variants as run.py's (e.g. @env+NAME=VALUE, @env-NAME)")
    ap.add_argument("--sides", default="pd,colocated",
                    help="pd, colocated or both, in that order; SIDE:probe = that side's probe only")  # fmt: skip
    ap.add_argument("--sweep", default="h200", choices=sorted(SWEEPS), help="the load points (and probe lengths)")
    ap.add_argument("--no-probe", action="store_true", help="skip the concurrency-1 probe")
    ap.add_argument("--no-sweep", action="store_true", help="probe only")
    ap.add_argument("--points", default="", help="only these sweep points (names, comma-separated; order kept)")
    ap.add_argument("--deadline-s", type=float, default=480.0, help="the whole run, start-up included")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--work", type=Path, default=Path("/tmp/hpd-load"))
    ap.add_argument("--model-dir", type=Path, default=None, help="default: bench/gpu/<the CR's served model name>")
    ap.add_argument("--bench-python", default=sys.executable, help="a Python with vLLM (runs bench_serve.py)")
    ap.add_argument("--gpus", default="0,1", help="the lane's GPUs, in order")
    ap.add_argument("--one-gpu-per-role", action="store_true", help="decode / the 2nd replica on the next GPU")
    ap.add_argument("--port-offset", type=int, default=0)
    ap.add_argument("--free-ports", action="store_true", help="every port from the OS (tests)")
    ap.add_argument("--vllm-site", action="append", default=[], metavar="VERSION=DIR")
    ap.add_argument("--fresh-cache", action="store_true", help="empty the cache volume first (cold)")
    ap.add_argument("--topology", choices=tuple(run.isolation.TOPOLOGIES), default="host",
                    help="how each role is isolated, as bench/gpu/run.py's --topology: host, pods (each role its own "
                         "PID, IPC and mount namespace: two default pods), pair (one pod's shared PID namespace)")  # fmt: skip
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    t0 = time.monotonic()
    deadline = t0 + args.deadline_s
    run.PORTS.update(
        {n: {"vllm": 8400 + 100 * i, "runtime": 8401 + 100 * i, "side": 5800} for i, n in enumerate(COLOCATED)}
    )
    run.GPUS[:] = [int(g) for g in args.gpus.split(",")]
    run.TOPOLOGY["name"] = args.topology
    run.shift_ports(args.port_offset)
    if args.free_ports:
        run.use_free_ports()
    run.VLLM_SITES.update(dict(x.split("=", 1) for x in args.vllm_site))
    args.out.mkdir(parents=True, exist_ok=True)
    args.work.mkdir(parents=True, exist_ok=True)
    cache_root = args.work / "cache-compile"
    if args.fresh_cache:
        import shutil

        shutil.rmtree(cache_root, ignore_errors=True)
    sides = [s for s in args.sides.split(",") if s]
    if not set(sides) <= {"pd", "colocated", "pd:probe", "colocated:probe"} or len({s[:2] for s in sides}) < len(sides):
        raise SystemExit(f"--sides: pd and/or colocated (each optionally :probe), not {args.sides}")
    probe_only = {s.partition(":")[0] for s in sides if s.endswith(":probe")}
    sides = [s.partition(":")[0] for s in sides]
    points, probes = ([] if args.no_sweep else SWEEPS[args.sweep]), ([] if args.no_probe else PROBES[args.sweep])
    if args.points:
        wanted = args.points.split(",")
        if unknown := set(wanted) - {p.name for p in points}:
            raise SystemExit(f"--points: not in sweep {args.sweep}: {sorted(unknown)}")
        points = [p for p in points if p.name in wanted]
    manifests = json.loads(args.rendered.read_text())["items"]
    cr, _, variant = args.cr.partition("@")
    model_dir = run.model_dir_for(manifests, cr, args.model_dir, args.work)
    model = run.served_name(manifests, cr)
    model_desc = f"{model} ({model_dir.name}: {model_geometry(model_dir)})"
    if not (model_dir / "tokenizer.json").exists():
        raise SystemExit(
            f"{cr}: no tokenizer in {model_dir}: vllm bench serve sends text, so the CR must be served "
            "with a tokenizer (no --skip-tokenizer-init in its extraArgs)"
        )
    base_env = {**os.environ, **run.NO_NVLINK_MULTICAST, "PYTHONUNBUFFERED": "1"}
    label = (
        "one GPU per role / replica"
        if args.one_gpu_per_role
        else ONE_GPU_COLOCATED_LABEL
        if sides == ["colocated"]
        else ONE_GPU_LABEL
    )
    report: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d"),
        "command": shlex.join(["python3", "bench/load/run_load.py", *(sys.argv[1:] if argv is None else argv)]),
        "burst_command": os.environ.get("HPD_BURST_COMMAND"), "gpu": run.gpu_name(), "hardware": label,
        "cr": cr, "variant": variant or None, "model_dir": str(model_dir), "sweep": args.sweep,
        "deadline_s": args.deadline_s, "slo": {"ttft_ms": SLO_TTFT_MS, "tpot_ms": SLO_TPOT_MS},
        "host_substitutions": run.HOST_SUBSTITUTIONS, "sides": {}, "skipped_sides": [],
        "plan": {"probe": [asdict(p) for p in probes], "points": [asdict(p) for p in points]},
    }  # fmt: skip
    result = args.out / "result.json"

    def save() -> None:
        report["requests"] = request_totals(report)
        roles = {n: r for rec in report["sides"].values() for n, r in (rec.get("roles") or {}).items()}
        # the engines' vLLM: the version the rendered env names (bench/gpu/run.py picks that version's site for them)
        vllm = next((r["env"].get(contract.ENV_VLLM_VERSION) for r in roles.values()), None)
        report["setup"] = setup_record(
            gpus=report["gpu"], model=model_desc, vllm=vllm, sides=sides, roles=roles, topology=args.topology
        )
        result.write_text(json.dumps(report, indent=1))

    reaper = Reaper(args.work / "pgids")
    reap(reaper.path)  # a previous run's engines cut short (none after a clean end)
    reaper.path.unlink(missing_ok=True)
    runner = BenchRunner(args.bench_python, args.out / "bench-serve.log", base_env, reaper)
    ran: list[str] | None = None
    pd_start_s: float | None = None
    try:
        for side in sides:
            rec: dict[str, Any] = report["sides"].setdefault(side, {"probe_only": side in probe_only})
            if side == "pd":
                roles = run.role_commands(manifests, cr, model_dir, cache_root)
                if args.one_gpu_per_role:
                    spread_roles(roles)
                rec["substitutions"] = ["the CR's prefill and decode as bench/gpu/run.py runs them"]
            else:
                roles, rec["substitutions"] = colocated_roles(
                    manifests, cr, model_dir, cache_root, args.one_gpu_per_role
                )
            rec["experiment"] = run.apply_variant(roles, variant)
            for r in roles.values():
                run.install_gemm_warmup_plugin(r, args.work)
            rec["roles"] = {n: {"argv": r.argv, "env": r.env} for n, r in roles.items()}
            dep = Deployment(side, roles, args.out, base_env, reaper)
            try:
                # a side followed by another may take at most half of the time left to start
                last = side == sides[-1]
                now = time.monotonic()
                rec["deployment"] = dep.start(deadline - STOP_EST_S if last else now + (deadline - now) / 2)
                if side == "pd":
                    pd_start_s = dep.t_started
                rec["load_generator"] = runner.wait_ready(max(deadline - time.monotonic(), 30))
                s = Side(side, runner, model=model, tokenizer=model_dir, work=args.work, record=rec, save=save)
                router = url(run.ROUTER_PORTS["http"])
                targets = [("router", router)] + (
                    [("decode", url(run.PORTS["decode"]["vllm"]))] if side == "pd" else []
                )
                s.probe(probes, targets, deadline - STOP_EST_S)
                end = sweep_end(
                    time.monotonic(), deadline - STOP_EST_S, next_side=side != sides[-1] and sides[-1] not in probe_only,
                    side_start_s=pd_start_s,
                    probe_s=sum(p.est_s for p in probes),  # the colocated side probes its router only
                )  # fmt: skip
                if side not in probe_only:
                    todo = points if ran is None else [p for p in points if p.name in ran]
                    done = s.sweep(todo, router, end, dep.alive)
                    ran = done if ran is None else ran
                rec["summary"] = [summary_row(r) for r in rec.get("probe", []) + rec.get("points", [])]
            except Exception as exc:  # a failed side is reported; the next one still runs
                rec["error"] = f"{type(exc).__name__}: {exc}"
            finally:
                if "decode" in roles:
                    try:  # before the roles stop: decode's /metrics is still up
                        rec["kv_transfer"] = run.kv_transfer_figures(roles["decode"])
                    except Exception as exc:
                        rec["kv_transfer"] = {"error": f"{type(exc).__name__}: {exc}"}
                rec["stop"] = dep.stop()
                rec["error_lines"] = {n: run.error_lines(r, 0) for n, r in roles.items() if r.log is not None}
                rec["seconds"] = round(time.monotonic() - t0, 1)
                save()
            if time.monotonic() > deadline:
                report["skipped_sides"] += [x for x in sides[sides.index(side) + 1 :]]
                break
    finally:
        runner.close()
        report["reaped_at_end"] = reap(reaper.path)
        if run.TOPOLOGY["holder"] is not None:  # the pair topology's namespace holder
            run.isolation.stop_holder(run.TOPOLOGY["holder"])
            run.TOPOLOGY["holder"] = run.TOPOLOGY["holder_pid"] = None
        report["seconds"] = round(time.monotonic() - t0, 1)
        save()
    brief = {side: {"start_s": (r.get("deployment") or {}).get("start_s"), "error": r.get("error"),
                    "skipped": r.get("skipped"), "summary": r.get("summary")} for side, r in report["sides"].items()}  # fmt: skip
    print(json.dumps(brief, indent=None)[:12000])
    return 0


if __name__ == "__main__":
    sys.exit(main())
