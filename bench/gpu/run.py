"""GPU proof: real vLLM on one H200 through our runtime (launch, warmup gate, readiness) and vllm-router.

Runs on the GPU machine after staging (see bench/gpu/README.md). One mode per invocation (eager or compile);
phases, side by side in one run:

  cold      both roles started through `python -m hpd_runtime launch` with an empty cache volume and warmup on;
            vllm-router (static URLs, vLLM NIXL P/D mode) in front; first request after Ready vs median of the
            next 10 (P->D through the router, and colocated on decode); Triton autotune events after Ready;
            P->D output token ids vs a colocated run on decode for 8 prompts of 300-3,000 tokens.
  warm      both roles restarted on the same cache volume: time to /readyz warm vs cold.
  nowarmup  the baseline: a fresh cache volume, warmup disabled; the same first/steady measurements.

The command lines come from the operator's own profile (`hpd_operator.profile.compute_profile`) for the sample
CR below, exactly as the operator would put them into the pods; the only substitutions are the ones one host
forces (distinct ports per instance, 127.0.0.1 as the pod IP, a local cache directory), listed in the JSON.
Everything talks to 127.0.0.1 only. Results: one JSON file per mode under --out.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
sys.path[:0] = [str(REPO / "operator"), str(REPO / "images" / "runtime")]

from hpd_operator.api.models import HybridPDDeploymentSpec  # noqa: E402
from hpd_operator.profile import compute_profile  # noqa: E402
from hpd_runtime import contract  # noqa: E402

AUTOTUNE_LINE = "Triton autotuning for function"
PORTS = {
    "prefill": {"vllm": 8200, "runtime": 8201, "side": 5600},
    "decode": {"vllm": 8300, "runtime": 8301, "side": 5700},
}
ROUTER_PORT = 8090
MAX_MODEL_LEN = 4096


DEFAULT_VLLM_VERSION = "0.20.0"


def sample_spec(
    model_dir: Path,
    mode: str,
    tp: tuple[int, int] = (1, 1),
    weights: str = "dummy",
    version: str = DEFAULT_VLLM_VERSION,
) -> dict[str, Any]:
    """The sample CR's spec: the tiny Nemotron-H, two instances sharing the GPU(s). `weights`: `dummy` (vLLM draws
    them, different per TP size) or `fixed` (the checkpoint make_checkpoint.py wrote into `model_dir`). `version`:
    spec.vllmVersion, the vLLM staged on the GPU machine (the profile's version rules follow it)."""
    extra = ["--skip-tokenizer-init", "--max-num-seqs", "64"]
    if weights == "dummy":
        extra = ["--load-format", "dummy", *extra]
    if mode == "eager":
        extra.append("--enforce-eager")
    return {
        "model": {"name": str(model_dir), "maxModelLen": MAX_MODEL_LEN, "hybrid": "mamba2",
                  "config": {"numAttentionHeads": 8, "numKeyValueHeads": 2, "mambaNumHeads": 16, "mambaNGroups": 2,
                             "hiddenSize": 512, "ssdChunkSize": 256, "hybridOverridePattern": "M-M*M-"}},
        "vllmVersion": version,
        "gpuMemoryUtilization": 0.3,
        "extraArgs": extra,
        "prefill": {"tensorParallelSize": tp[0]},
        "decode": {"tensorParallelSize": tp[1]},
        "warmup": {"enabled": True, "pairCheck": True, "timeoutSeconds": 400},
    }  # fmt: skip


def expand_k8s_vars(value: str, env: dict[str, str]) -> str:
    """Kubernetes' `$(VAR)` expansion in env values (as the kubelet does it)."""
    return re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: env.get(m.group(1), m.group(0)), value)


@dataclass
class Role:
    name: str
    args: list[str]
    env: dict[str, str]
    log: Path | None = None
    proc: subprocess.Popen[bytes] | None = None
    t_start: float = 0.0
    t_health: float | None = None
    t_ready: float | None = None
    log_offset_at_ready: int = 0


@dataclass
class Phase:
    name: str
    roles: dict[str, Role] = field(default_factory=dict)
    result: dict[str, Any] = field(default_factory=dict)


NO_NVLINK_MULTICAST: dict[str, str] = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}
"""Kept set in every process we start: NVLink multicast can take a shared host's GPUs out of service."""


def role_commands(
    mode: str,
    model_dir: Path,
    cache_root: Path,
    warmup: bool,
    *,
    tp: tuple[int, int] = (1, 1),
    weights: str = "dummy",
    version: str = DEFAULT_VLLM_VERSION,
) -> tuple[dict[str, Role], list[str]]:
    """Per-role argv/env from the operator's profile. With TP > 1 a role uses GPUs 0..TP-1, so both roles share
    GPU 0 (P TP=2 over GPUs 0-1 with D TP=1 on GPU 0, as issue #7 asks)."""
    spec_dict = sample_spec(model_dir, mode, tp, weights, version)
    spec_dict["warmup"]["enabled"] = warmup
    spec = HybridPDDeploymentSpec.model_validate(spec_dict)
    profile = compute_profile(spec)
    substitutions = [
        "HPD_POD_IP=127.0.0.1 (one host; the operator uses the downward API status.podIP)",
        "--port / HPD_VLLM_PORT, HPD_RUNTIME_PORT, VLLM_NIXL_SIDE_CHANNEL_PORT distinct per role (one host)",
        "HPD_CACHE_DIR=<local dir> (the operator mounts the cache volume at /cache)",
        "HPD_PREFILL_SERVICE=127.0.0.1 + HPD_PREFILL_PORT (the operator uses the prefill headless Service)",
        "HPD_RUNTIME_HOST=127.0.0.1, TRITON_PRINT_AUTOTUNING=1 (measurement)",
        "CUDA_VISIBLE_DEVICES=0..TP-1 per role, so both roles share GPU 0 (on Kubernetes each pod has its own GPUs)",
    ]
    roles: dict[str, Role] = {}
    for name in contract.ROLES:
        rp = profile.role(name)
        ports = PORTS[name]
        args = list(rp.args)
        i = args.index("--port")
        args[i + 1] = str(ports["vllm"])
        env: dict[str, str] = {contract.ENV_POD_IP: "127.0.0.1"}
        for entry in rp.env_k8s():
            if "value" in entry:
                env[str(entry["name"])] = expand_k8s_vars(str(entry["value"]), env)
        env.update({
            contract.ENV_VLLM_PORT: str(ports["vllm"]),
            contract.ENV_RUNTIME_PORT: str(ports["runtime"]),
            contract.ENV_RUNTIME_HOST: "127.0.0.1",
            contract.ENV_VLLM_NIXL_SIDE_CHANNEL_PORT: str(ports["side"]),
            contract.ENV_CACHE_DIR: str(cache_root),
            contract.ENV_MAX_MODEL_LEN: str(MAX_MODEL_LEN),
            contract.ENV_GPU_PRODUCT: "NVIDIA-H200",
            "TRITON_PRINT_AUTOTUNING": "1",
            "CUDA_VISIBLE_DEVICES": ",".join(str(g) for g in range(rp.tensor_parallel_size)),
            **NO_NVLINK_MULTICAST,
        })  # fmt: skip
        if name == "decode":
            env[contract.ENV_PREFILL_SERVICE] = "127.0.0.1"
            env[contract.ENV_PREFILL_PORT] = str(PORTS["prefill"]["vllm"])
        roles[name] = Role(name, args, env)
    return roles, substitutions


def http_ok(url: str, timeout: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return bool(r.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def post(
    url: str, body: dict[str, Any], headers: dict[str, str] | None = None, timeout: float = 600
) -> tuple[float, Any]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json", **(headers or {})})  # fmt: skip
    t = time.perf_counter()
    with urllib.request.urlopen(req, timeout=timeout) as r:
        out = json.loads(r.read())
    return time.perf_counter() - t, out


KV_ALLOCATED = "GPU KV cache size"
"""vLLM logs this once its memory profile is done and the KV cache is sized. Two instances that profile at the
same moment on one GPU see each other's allocations and one fails with "No available memory for the cache
blocks" (seen here), so the second role starts only after the first one logged this line (one host only: on
Kubernetes each role has its own GPUs)."""


def _wait_kv_allocated(role: Role, deadline: float) -> None:
    assert role.proc is not None and role.log is not None
    while time.perf_counter() < deadline:
        if role.proc.poll() is not None:
            raise RuntimeError(f"{role.name} exited with {role.proc.returncode}; see {role.log.name}")
        if KV_ALLOCATED in role.log.read_text(errors="replace"):
            return
        if http_ok(f"http://127.0.0.1:{PORTS[role.name]['vllm']}/health", 0.5):
            return
        time.sleep(0.5)
    raise TimeoutError(f"{role.name}: no '{KV_ALLOCATED}' line in time")


def start_roles(phase: Phase, out: Path, base_env: dict[str, str]) -> None:
    previous: Role | None = None
    for role in phase.roles.values():
        if previous is not None:
            _wait_kv_allocated(previous, time.perf_counter() + 300)
        previous = role
        role.log = out / f"{phase.name}-{role.name}.log"
        env = {**base_env, **role.env}
        role.t_start = time.perf_counter()
        with role.log.open("wb") as fh:
            role.proc = subprocess.Popen(
                [sys.executable, "-m", "hpd_runtime", "launch", "--", *role.args],
                env=env, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip


def wait_ready(phase: Phase, deadline: float) -> None:
    pending = dict(phase.roles)
    while pending:
        for name, role in list(pending.items()):
            assert role.proc is not None and role.log is not None
            if role.proc.poll() is not None:
                raise RuntimeError(f"{phase.name}/{name} exited with {role.proc.returncode}; see {role.log.name}")
            now = time.perf_counter()
            if role.t_health is None and http_ok(f"http://127.0.0.1:{PORTS[name]['vllm']}/health"):
                role.t_health = now - role.t_start
            if http_ok(f"http://127.0.0.1:{PORTS[name]['runtime']}{contract.PATH_READYZ}"):
                role.t_ready = now - role.t_start
                role.log_offset_at_ready = role.log.stat().st_size
                del pending[name]
        if time.perf_counter() > deadline:
            raise TimeoutError(f"{phase.name}: not ready in time: {sorted(pending)}")
        time.sleep(0.25)


def stop_roles(roles: dict[str, Role]) -> dict[str, int | None]:
    codes: dict[str, int | None] = {}
    for role in roles.values():
        if role.proc is not None and role.proc.poll() is None:
            role.proc.send_signal(signal.SIGTERM)
    for name, role in roles.items():
        if role.proc is None:
            continue
        try:
            codes[name] = role.proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(role.proc.pid, signal.SIGKILL)
            codes[name] = role.proc.wait(10)
    # vLLM's engine core runs in its own process; make sure the GPU memory is free before the next phase.
    for _ in range(120):
        if not any(http_ok(f"http://127.0.0.1:{PORTS[n]['vllm']}/health", 0.5) for n in roles):
            break
        time.sleep(0.5)
    time.sleep(3)
    return codes


def autotune_after_ready(role: Role) -> int:
    assert role.log is not None
    with role.log.open("rb") as fh:
        fh.seek(role.log_offset_at_ready)
        return fh.read().decode(errors="replace").count(AUTOTUNE_LINE)


def autotune_total(role: Role) -> int:
    assert role.log is not None
    return role.log.read_text(errors="replace").count(AUTOTUNE_LINE)


class Router:
    def __init__(self, out: Path, name: str, env: dict[str, str]) -> None:
        self.log = out / f"{name}-router.log"
        argv = [
            sys.executable, "-c", "import sys; from vllm_router.launch_router import main; sys.exit(main())",
            "--vllm-pd-disaggregation",
            "--prefill", f"http://127.0.0.1:{PORTS['prefill']['vllm']}",
            "--decode", f"http://127.0.0.1:{PORTS['decode']['vllm']}",
            "--policy", "round_robin", "--host", "127.0.0.1", "--port", str(ROUTER_PORT),
            "--prometheus-host", "127.0.0.1", "--prometheus-port", "29001",
        ]  # fmt: skip
        with self.log.open("wb") as fh:
            self.proc = subprocess.Popen(argv, env=env, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 120
        while not http_ok(f"http://127.0.0.1:{ROUTER_PORT}/health"):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"router did not come up; see {self.log.name}")
            time.sleep(0.25)

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)


def prompt(rng: random.Random, n: int) -> list[int]:
    return [rng.randint(3, 2000) for _ in range(n)]


def completion(model: str, ids: list[int], max_tokens: int) -> dict[str, Any]:
    return {"model": model, "prompt": ids, "max_tokens": max_tokens, "temperature": 0, "return_token_ids": True,
            "ignore_eos": True}  # fmt: skip


def token_ids(resp: dict[str, Any]) -> list[int] | None:
    choice = resp["choices"][0]
    ids = choice.get("token_ids")
    return list(ids) if ids is not None else None


def first_vs_steady(url: str, model: str, rng: random.Random, n: int = 10, length: int = 1500) -> dict[str, Any]:
    times = []
    for _ in range(n + 1):
        dt, _ = post(url, completion(model, prompt(rng, length), 8), {"X-Request-Id": str(uuid.uuid4())})
        times.append(dt)
    steady = statistics.median(times[1:])
    return {"first_s": round(times[0], 4), "steady_median_s": round(steady, 4), "first_over_steady": round(times[0] / steady, 2),
            "all_s": [round(t, 4) for t in times], "prompt_tokens": length}  # fmt: skip


def serving_measurements(phase: Phase, model: str, with_outputs: bool) -> None:
    rng = random.Random(20261129)
    router_url = f"http://127.0.0.1:{ROUTER_PORT}/v1/completions"
    decode_url = f"http://127.0.0.1:{PORTS['decode']['vllm']}/v1/completions"
    phase.result["pd_via_router"] = first_vs_steady(router_url, model, rng)
    phase.result["colocated_on_decode"] = first_vs_steady(decode_url, model, rng)
    if with_outputs:
        rows = []
        for i, length in enumerate([300, 650, 1000, 1400, 1800, 2200, 2600, 3000]):
            ids = prompt(random.Random(1000 + i), length)
            _, pd = post(router_url, completion(model, ids, 16), {"X-Request-Id": str(uuid.uuid4())})
            _, co = post(decode_url, completion(model, ids, 16), {"X-Request-Id": str(uuid.uuid4())})
            a, b = token_ids(pd), token_ids(co)
            rows.append({"prompt_tokens": length, "pd_token_ids": a, "colocated_token_ids": b,
                         "identical": a is not None and a == b})  # fmt: skip
        phase.result["pd_vs_colocated"] = {
            "prompts": len(rows),
            "identical": sum(r["identical"] for r in rows),
            "rows": rows,
        }
    time.sleep(1)
    phase.result["autotune_events_after_ready"] = {n: autotune_after_ready(r) for n, r in phase.roles.items()}
    phase.result["autotune_events_total"] = {n: autotune_total(r) for n, r in phase.roles.items()}
    logs = {n: r.log.read_text(errors="replace") for n, r in phase.roles.items() if r.log}
    phase.result["nixl_errors_in_decode_log"] = sum(
        1
        for line in logs.get("decode", "").splitlines()
        if "ERROR" in line and ("nixl" in line.lower() or "kv" in line.lower())
    )


def block_sizes(phase: Phase) -> dict[str, dict[str, int | None]]:
    """vLLM's attention and kernel block sizes per role, from its log: NIXL needs them equal on both roles."""
    out: dict[str, dict[str, int | None]] = {}
    for name, role in phase.roles.items():
        text = role.log.read_text(errors="replace") if role.log and role.log.exists() else ""
        attn = re.search(r"Setting attention block size to (\d+) tokens", text)
        kernel = re.search(r"physical kernel block size \((\d+)\)", text)
        out[name] = {
            "attention": int(attn.group(1)) if attn else None,
            "kernel": int(kernel.group(1)) if kernel else None,
        }
    return out


def role_times(phase: Phase) -> dict[str, Any]:
    return {n: {"to_health_s": round(r.t_health or -1, 1), "to_readyz_s": round(r.t_ready or -1, 1),
                "warmup_s": round((r.t_ready or 0) - (r.t_health or 0), 1)} for n, r in phase.roles.items()}  # fmt: skip


def gpu_name() -> str:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                             text=True, check=False)  # fmt: skip
    except FileNotFoundError:
        return "none (nvidia-smi not found)"
    return out.stdout.strip()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", choices=["eager", "compile"], required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--work", type=Path, default=Path("/tmp/hpd-bench"))
    ap.add_argument("--budget-s", type=float, default=560, help="skip phases that would not finish in time")
    ap.add_argument("--phases", default="cold,warm,nowarmup")
    ap.add_argument("--prefill-tp", type=int, default=1, help="prefill TP (GPUs 0..N-1)")
    ap.add_argument("--decode-tp", type=int, default=1, help="decode TP (GPUs 0..N-1)")
    ap.add_argument("--weights", choices=["dummy", "fixed"], default="dummy",
                    help="fixed: the seeded checkpoint of make_checkpoint.py, the same weights at every TP size")  # fmt: skip
    ap.add_argument("--vllm-version", default=DEFAULT_VLLM_VERSION,
                    help="spec.vllmVersion: the vLLM staged on this machine (bench/gpu/stage.sh VERSION)")  # fmt: skip
    args = ap.parse_args()
    t0 = time.monotonic()
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    tp = (args.prefill_tp, args.decode_tp)
    model_dir = HERE / "tiny-nemotron-h"
    if args.weights == "fixed":
        import make_checkpoint

        model_dir = args.work / "tiny-nemotron-h-fixed"
        make_checkpoint.write_checkpoint(model_dir, HERE / "tiny-nemotron-h" / "config.json")
    base_env = {**os.environ, **NO_NVLINK_MULTICAST}
    base_env["PYTHONPATH"] = os.pathsep.join([str(REPO / "images" / "runtime"), base_env.get("PYTHONPATH", "")])
    base_env["PYTHONUNBUFFERED"] = "1"
    report: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d"), "mode": args.mode, "command": " ".join(sys.argv),
        "gpu": gpu_name(), "tensor_parallel": {"prefill": tp[0], "decode": tp[1]}, "weights": args.weights,
        "vllm_version": args.vllm_version,
        "phases": {},
    }  # fmt: skip
    suffix = "" if (tp, args.weights) == ((1, 1), "dummy") else f"-p{tp[0]}d{tp[1]}-{args.weights}"
    suffix += "" if args.vllm_version == DEFAULT_VLLM_VERSION else f"-v{args.vllm_version}"
    result_file = out / f"gpu-{args.mode}{suffix}.json"

    def save() -> None:
        result_file.write_text(json.dumps(report, indent=2))

    cache = args.work / f"cache-{args.mode}"
    shutil.rmtree(cache, ignore_errors=True)
    wanted = args.phases.split(",")
    plan = [("cold", cache, True), ("warm", cache, True), ("nowarmup", args.work / f"cache-{args.mode}-nowarm", False)]
    for name, cache_root, warmup in plan:
        if name not in wanted:
            continue
        if name == "nowarmup":
            shutil.rmtree(cache_root, ignore_errors=True)
        elapsed = time.monotonic() - t0
        if elapsed > args.budget_s * (0.55 if name == "nowarmup" else 0.75):
            report["phases"][name] = {"skipped": f"time budget: {elapsed:.0f} s used of {args.budget_s:.0f}"}
            save()
            continue
        roles, substitutions = role_commands(
            args.mode, model_dir, cache_root, warmup, tp=tp, weights=args.weights, version=args.vllm_version
        )
        report.setdefault("argv", {n: r.args for n, r in roles.items()})
        report.setdefault("env", {n: r.env for n, r in roles.items()})
        report.setdefault("one_host_substitutions", substitutions)
        phase = Phase(name, roles)
        router: Router | None = None
        try:
            start_roles(phase, out, base_env)
            wait_ready(phase, time.perf_counter() + 420)
            phase.result["times"] = role_times(phase)
            phase.result["block_sizes"] = block_sizes(phase)
            if name != "warm":
                router = Router(out, name, base_env)
                serving_measurements(phase, str(model_dir), with_outputs=(name == "cold"))
        except Exception as exc:  # a failed phase is reported, the next one still runs
            phase.result["error"] = f"{type(exc).__name__}: {exc}"
            phase.result.setdefault("times", role_times(phase))
        finally:
            if router is not None:
                router.stop()
            phase.result["exit_codes_after_sigterm"] = stop_roles(phase.roles)
            report["phases"][name] = phase.result
            save()
    cold, warm = report["phases"].get("cold", {}), report["phases"].get("warm", {})
    try:
        report["ratios"] = {
            f"ready_warm_over_cold_{r}": round(warm["times"][r]["to_readyz_s"] / cold["times"][r]["to_readyz_s"], 3)
            for r in contract.ROLES
        }
    except (KeyError, ZeroDivisionError, TypeError):
        report["ratios"] = {}
    save()
    print(json.dumps({k: v for k, v in report.items() if k not in ("argv", "env")}, indent=1)[:6000])
    return 0


if __name__ == "__main__":
    sys.exit(main())
