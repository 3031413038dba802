"""`launch`: run `vllm serve` as a supervised child with a keyed cache, the warmup and the readiness server.

Not `execvp`: the warmup thread and the readiness server live in this process, next to vLLM. Instead this
process forwards SIGTERM/SIGINT to vLLM (its own session, so a terminal's Ctrl-C is not delivered twice) and
exits with vLLM's exit status (128 + signal number when vLLM was killed by a signal, like a shell).

Pure parts, unit-tested: `vllm_argv`, `cache_key`, `cache_env`, `exit_code`, `parse_gpu_product`.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from types import FrameType
from typing import IO

from hpd_runtime import contract as c
from hpd_runtime import group, triton_cache, ucx_transport
from hpd_runtime.config import RuntimeConfig, arg_value, load_config
from hpd_runtime.log import log_event
from hpd_runtime.readiness import ReadinessServer, RuntimeMetrics, RuntimeState
from hpd_runtime.warmup import Resolver, resolve_prefill, start_warmup_thread

VLLM_MODULE = "vllm.entrypoints.cli.main"
"""`python -m vllm.entrypoints.cli.main serve ...` is what the `vllm` console script runs; the module form also
works where vLLM is only on PYTHONPATH (no console script), as on the GPU machine."""
NVIDIA_SMI_QUERY = ("nvidia-smi", "--query-gpu=name", "--format=csv,noheader")
FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def vllm_argv(cfg: RuntimeConfig, args: Sequence[str], python: str = sys.executable) -> list[str]:
    """The child's argv: `python -m vllm.entrypoints.cli.main serve ARGS`, or HPD_VLLM_COMMAND + ARGS."""
    if cfg.vllm_command:
        return [*shlex.split(cfg.vllm_command), *args]
    return [python, "-m", VLLM_MODULE, "serve", *args]


def _slug(value: str, limit: int) -> str:
    s = re.sub(r"[^a-z0-9.]+", "-", value.lower()).strip("-.")
    return s[:limit].strip("-.") or "x"


def normalize_gpu_product(product: str) -> str:
    """`NVIDIA H200` (nvidia-smi) and `NVIDIA-H200` (the GPU operator's node label) are the same product."""
    return re.sub(r"[^a-z0-9]+", "-", product.lower()).strip("-") or "unknown"


def cache_key(model: str, vllm_version: str, gpu_product: str, tensor_parallel_size: int, role: str) -> str:
    """Filesystem-safe key `<model>_<vllm>_<gpu>_tp<N>_<role>_<hash10>` (at most ~120 chars).

    The readable parts are truncated slugs; the hash covers the exact model string and the normalized GPU
    product and vLLM version, so two models whose slugs collide still get different keys.
    """
    version = vllm_version.strip().lower().removeprefix("v")
    gpu = normalize_gpu_product(gpu_product)
    ident = json.dumps([model, version, gpu, tensor_parallel_size, role], separators=(",", ":"))
    digest = hashlib.sha256(ident.encode()).hexdigest()[:10]
    return (
        f"{_slug(model, 48)}_{_slug(version, 24)}_{_slug(gpu, 24)}_tp{tensor_parallel_size}_{_slug(role, 8)}_{digest}"
    )


def cache_env(cache_root: str, key: str, stable_triton: bool = True) -> dict[str, str]:
    """Env that points every compile/JIT/autotune cache at `<cache_root>/<key>/...`."""
    base = os.path.join(cache_root, key)
    env = {
        c.ENV_VLLM_CACHE_ROOT: os.path.join(base, "vllm"),
        c.ENV_TRITON_CACHE_DIR: os.path.join(base, "triton"),
        c.ENV_XDG_CACHE_HOME: os.path.join(base, "xdg"),
        c.ENV_TORCHINDUCTOR_CACHE_DIR: os.path.join(base, "inductor"),
        c.ENV_FLASHINFER_WORKSPACE_BASE: os.path.join(base, "flashinfer"),
        c.ENV_CUDA_CACHE_PATH: os.path.join(base, "cuda"),
        c.ENV_CACHE_KEY: key,
    }
    if stable_triton:
        env[c.ENV_TRITON_STABLE_DIR] = env[c.ENV_TRITON_CACHE_DIR]
        env[c.ENV_TRITON_CACHE_MANAGER] = triton_cache.MANAGER_SPEC
    return env


CACHE_DIR_VARS = (
    c.ENV_VLLM_CACHE_ROOT,
    c.ENV_TRITON_CACHE_DIR,
    c.ENV_XDG_CACHE_HOME,
    c.ENV_TORCHINDUCTOR_CACHE_DIR,
    c.ENV_FLASHINFER_WORKSPACE_BASE,
    c.ENV_CUDA_CACHE_PATH,
)


def exit_code(returncode: int) -> int:
    """Popen's returncode (negative = killed by signal) -> a shell-style exit status."""
    return 128 - returncode if returncode < 0 else returncode


def parse_gpu_product(nvidia_smi_output: str) -> str | None:
    for line in nvidia_smi_output.splitlines():
        if line.strip():
            return line.strip()
    return None


def detect_gpu_product(
    configured: str | None, run: Callable[..., subprocess.CompletedProcess[str]] = subprocess.run
) -> str:
    """HPD_GPU_PRODUCT when set, else the first GPU's name from nvidia-smi, else `unknown`."""
    if configured:
        return configured
    try:
        out = run(list(NVIDIA_SMI_QUERY), capture_output=True, text=True, timeout=15, check=True)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return parse_gpu_product(out.stdout) or "unknown"


def child_env(
    env: Mapping[str, str], cfg: RuntimeConfig, gpu_product: str, stable_triton: bool | None = None
) -> tuple[dict[str, str], str, dict[str, str]]:
    """(env for vLLM, cache key, the cache vars applied). Vars the pod already sets explicitly win."""
    key = cache_key(cfg.model, cfg.vllm_version, gpu_product, cfg.tensor_parallel_size, cfg.role)
    wanted = cache_env(cfg.cache_dir, key, cfg.stable_triton_cache if stable_triton is None else stable_triton)
    out = dict(env)
    applied: dict[str, str] = {}
    for k, v in wanted.items():
        if k not in out or not out[k].strip():
            out[k] = v
            applied[k] = v
    return out, key, applied


def _make_cache_dirs(env: Mapping[str, str], applied: Mapping[str, str]) -> str | None:
    """Create the keyed dirs; returns an error string when the cache volume is not writable."""
    try:
        for k in CACHE_DIR_VARS:
            if k in applied:
                os.makedirs(env[k], exist_ok=True)
    except OSError as e:
        return str(e)
    return None


def transport_env(cfg: RuntimeConfig, env: Mapping[str, str]) -> dict[str, str]:
    """Decode (the NIXL reader) asks UCX to print its protocol tables, `UCX_PROTO_INFO=y`, unless the pod sets the
    variable itself (`n` turns the report off). UCX prints each table once, when an operation first selects its
    protocol: some 10-30 tables per process at start-up, nothing per request."""
    if cfg.role != "decode" or cfg.worker or ucx_transport.PROTO_INFO_ENV in env:
        return {}
    return {ucx_transport.PROTO_INFO_ENV: "y"}


def captures_ucx_transport(cfg: RuntimeConfig, env: Mapping[str, str]) -> bool:
    """Decode reads UCX's protocol table from vLLM's stdout when UCX prints it (UCX_PROTO_INFO on): that table
    names the transport its KV reads use (`ucx_transport`). Otherwise vLLM's stdout is the container's, untouched."""
    return (
        cfg.role == "decode"
        and not cfg.worker
        and ucx_transport.proto_info_enabled(env.get(ucx_transport.PROTO_INFO_ENV))
    )


def forward_output(
    src: IO[bytes], dst: IO[bytes], on_choice: Callable[[ucx_transport.Choice], None]
) -> ucx_transport.Watch:
    """Copy vLLM's stdout to ours line by line (so the container log is unchanged) and feed each line to a
    `ucx_transport.Watch`; `on_choice` gets every table of a remote read/write of GPU memory. Returns at EOF."""
    watch = ucx_transport.Watch()
    for raw in iter(src.readline, b""):
        try:
            dst.write(raw)
            dst.flush()
        except (OSError, ValueError):
            pass  # our stdout closed: keep draining vLLM's, or it blocks on a full pipe
        choice = watch.feed(raw.decode("utf-8", "replace"))
        if choice is not None:
            on_choice(choice)
    last = watch.flush()
    if last is not None:
        on_choice(last)
    return watch


def report_transport(state: RuntimeState) -> Callable[[ucx_transport.Choice], None]:
    def on_choice(choice: ucx_transport.Choice) -> None:
        if state.kv_transport() != choice.transport:
            log_event("kv_transport", transport=choice.transport, protocol=choice.protocol, config=choice.config,
                      operation=choice.operation)  # fmt: skip
        state.set_kv_transport(choice.transport)

    return on_choice


class Launcher:
    def __init__(self, vllm_args: Sequence[str], env: Mapping[str, str], resolver: Resolver = resolve_prefill) -> None:
        self.args = list(vllm_args)
        self.env = env
        self.cfg = load_config(env, self.args)
        self.resolver = resolver
        self.proc: subprocess.Popen[bytes] | None = None
        self.stop = threading.Event()
        self.broken: str | None = None
        """Set when the pair monitor gave up on P->D: vLLM is stopped and `run` exits EXIT_PAIR_BROKEN."""
        self.stopped_by: int | None = None
        """A signal that came before vLLM was started (a worker waiting for its leader)."""

    def _pair_broken(self, reason: str) -> None:
        """P->D stayed broken after it had passed: stop vLLM so the kubelet restarts the container (a fresh NIXL
        agent; vLLM's port closes at once, so even a router that ignores readiness stops getting answers)."""
        if not self.cfg.pair_restart_on_break:
            log_event("pair_broken", level="error", reason=reason, action="none (HPD_PAIR_RESTART_ON_BREAK off)")
            return
        self.broken = reason
        log_event("pair_broken", level="error", reason=reason, action="stopping vLLM; the container restarts")
        proc = self.proc
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)

    def _alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def _forward(self, signum: int, _frame: FrameType | None) -> None:
        proc = self.proc
        log_event("signal_forwarded", signal=signal.Signals(signum).name, pid=proc.pid if proc else None)
        if proc is None:  # still waiting (a worker, for its leader): stop waiting
            self.stopped_by = signum
            self.stop.set()
        else:
            try:
                proc.send_signal(signum)
            except ProcessLookupError:
                pass

    def _wait_for_leader(self, state: RuntimeState) -> bool:
        """A worker: until the leader's rendezvous answers (False: stopped by a signal first)."""
        leader = group.leader_address(self.args)
        if leader is None:
            return True  # no --master-addr: nothing to wait for (vLLM itself will say what is missing)
        state.set_phase("waiting", f"for the group leader at {leader[0]}:{leader[1]}")
        log_event("waiting_for_leader", host=leader[0], port=leader[1])

        def report(why: str) -> None:
            state.set_phase("waiting", why)

        ok = group.wait_for_leader(*leader, self.stop, report)
        if ok:
            log_event("leader_reachable", host=leader[0], port=leader[1])
        return ok

    def _start_vllm(self, argv: list[str], env: dict[str, str], state: RuntimeState) -> subprocess.Popen[bytes] | None:
        """Start vLLM (None when it cannot be started); on decode its stdout passes through a reader that notes the
        UCX transport it prints (forward_output), unchanged."""
        capture = captures_ucx_transport(self.cfg, env)
        try:
            proc = subprocess.Popen(argv, env=env, start_new_session=True, stdout=subprocess.PIPE if capture else None)
        except OSError as e:
            log_event("vllm_start_failed", level="error", argv=argv, error=str(e))
            return None
        if capture and proc.stdout is not None:
            threading.Thread(
                target=forward_output,
                args=(proc.stdout, sys.stdout.buffer, report_transport(state)),
                name="vllm-stdout",
                daemon=True,
            ).start()
        return proc

    def run(self) -> int:
        cfg = self.cfg
        gpu = detect_gpu_product(cfg.gpu_product)
        env, key, applied = child_env(self.env, cfg, gpu)
        error = _make_cache_dirs(env, applied)
        if error is not None:
            # Serving without a persistent cache is slower to start but correct; do not refuse to start.
            log_event("cache_unavailable", level="warning", cache_dir=cfg.cache_dir, error=error)
            for k in applied:
                env.pop(k, None)
                if k in self.env:
                    env[k] = self.env[k]
            applied = {}
        env.update(transport_env(cfg, env))
        argv = vllm_argv(cfg, self.args)
        log_event(
            "launch",
            role=cfg.role,
            model=cfg.model,
            vllm_version=cfg.vllm_version,
            gpu_product=gpu,
            tensor_parallel_size=cfg.tensor_parallel_size,
            cache_key=key,
            cache_env=applied,
            argv=argv,
        )
        metrics = RuntimeMetrics()
        state = RuntimeState(metrics, child_alive=self._alive)
        server = ReadinessServer(state, cfg).start()
        previous = {s: signal.signal(s, self._forward) for s in FORWARDED_SIGNALS}
        try:
            if cfg.worker and not self._wait_for_leader(state):
                return 128 + (self.stopped_by or signal.SIGTERM)
            self.proc = self._start_vllm(argv, env, state)
            if self.proc is None:
                return 127
            if cfg.worker:
                state.mark_warm(f"headless ranks running ({group_rank(self.args)}); the group's leader serves the API")
            else:
                start_warmup_thread(cfg, state, self.stop, self.resolver, on_broken=self._pair_broken)
            returncode = self.proc.wait()
        finally:
            self.stop.set()
            for s, h in previous.items():
                signal.signal(s, h)
            server.stop()
        code = exit_code(returncode)
        if self.broken is not None:
            code = c.EXIT_PAIR_BROKEN
        log_event("vllm_exited", level="info" if code == 0 else "error", returncode=returncode, exit_code=code)
        return code


def group_rank(args: Sequence[str]) -> str:
    """`node rank R of N` from a multi-node vLLM argv (as the kubelet expanded it)."""
    return f"node rank {arg_value(args, '--node-rank')} of {arg_value(args, '--nnodes')}"


def launch(vllm_args: Sequence[str], env: Mapping[str, str] | None = None) -> int:
    return Launcher(vllm_args, os.environ if env is None else env).run()
