"""bench/gpu/run.py's teardown survives the burst's time limit: gpu-burst.sh stops run.py with SIGINT and SIGKILLs
it 30 s later. On 2026-12-03 the SIGINT came inside `stop_roles` while a decode's vLLM drained on SIGTERM; the
teardown stopped there, run.py was killed, and the decode's launcher (its own session, as the bench starts every
role) kept its runtime port bound: the next run's decode failed with 'Address already in use'.

Here a role is a stand-in launcher as ours is built (its runtime port, vLLM started in a session of its own, SIGTERM
forwarded and the child waited for) whose "vLLM" holds its port and drains far longer than the test waits. A driver
process runs `stop_roles` on it as run_step does; the test interrupts it the way gpu-burst.sh's `timeout` does
(SIGINT, then SIGKILL a few seconds later) and checks that no process of the role is left and both ports are free.

Without an interrupt, under `pair`, a role's own process is nsenter: SIGTERM ends it at once while the launcher below
still shuts vLLM down and holds its runtime port; the teardown must wait for the launcher too (a second plan item in
one run.py invocation found its prefill's runtime port still bound)."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

LAUNCHER = textwrap.dedent("""
    import os, signal, socket, subprocess, sys, time
    runtime_port, vllm_port, pids = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    srv = socket.socket(); srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("127.0.0.1", runtime_port)); srv.listen()
    vllm = subprocess.Popen([sys.executable, "-c", '''
    import signal, socket, sys, time
    signal.signal(signal.SIGTERM, lambda *a: None)  # drains: SIGTERM does not end it
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", int(sys.argv[1]))); s.listen()
    time.sleep(300)
    ''', str(vllm_port)], start_new_session=True)
    with open(pids, "w") as fh:
        fh.write(f"{os.getpid()} {vllm.pid}")
    signal.signal(signal.SIGTERM, lambda *a: vllm.send_signal(signal.SIGTERM))
    vllm.wait()
""")

DRIVER = textwrap.dedent("""
    import importlib.util, socket, sys, time
    from pathlib import Path
    spec = importlib.util.spec_from_file_location("bench_gpu_run_stop", sys.argv[1])
    run = importlib.util.module_from_spec(spec); sys.modules[spec.name] = run; spec.loader.exec_module(run)
    run.interruptible()  # as run.main does first
    runtime_port, vllm_port = int(sys.argv[3]), int(sys.argv[4])
    run.PORTS["decode"].update(vllm=vllm_port, runtime=runtime_port)
    role = run.Role("decode", [sys.executable, sys.argv[2], str(runtime_port), str(vllm_port), sys.argv[5]], {}, 1)
    run.start_role(role, Path(sys.argv[6]), "t", {"PATH": "/usr/bin:/bin"})
    while any(socket.socket().connect_ex(("127.0.0.1", p)) for p in (runtime_port, vllm_port)):
        time.sleep(0.05)
    print("stopping", flush=True)
    run.stop_roles({"decode": role}, 60.0)  # what run_step's teardown passes outside the decode steps
""")


WRAPPER = textwrap.dedent("""
    import subprocess, sys
    sys.exit(subprocess.call(sys.argv[1:]))  # SIGTERM's default action ends it; the child (same group) goes on
""")

SLOW_LAUNCHER = textwrap.dedent("""
    import signal, socket, sys, time
    stopping = []
    signal.signal(signal.SIGTERM, lambda *a: stopping.append(time.monotonic()))
    srv = socket.socket(); srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("127.0.0.1", int(sys.argv[1]))); srv.listen()
    print("up", flush=True)
    while not stopping or time.monotonic() < stopping[0] + 2.0:  # 2 s to stop its vLLM, then exits
        time.sleep(0.05)
""")


KILL_AFTER_S = 30.0
"""gpu-burst.sh's `timeout -k 30`: how long the teardown has after SIGINT before the machine SIGKILLs it (a bound
of 5 s here was tighter than the script's and failed once on a loaded 2-core CI machine: the driver was killed with
no output)."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def interrupt(pid: int, to: str) -> None:
    """SIGINT to the process (the kernel picks a thread that does not block it), or to a thread other than the main
    one (tgkill): what the kernel may choose under load, and the case where an unbounded join() hung the teardown
    until the role's grace had passed (two clean-clone CI runs killed the driver with no output)."""
    if to == "process":
        os.kill(pid, signal.SIGINT)
        return
    others = [int(t) for t in os.listdir(f"/proc/{pid}/task") if int(t) != pid]
    assert others, "the teardown's stop thread is not running"
    libc = ctypes.CDLL(None, use_errno=True)
    assert libc.syscall(SYS_TGKILL, pid, others[0], signal.SIGINT) == 0, os.strerror(ctypes.get_errno())


SYS_TGKILL = 234
"""tgkill(2) on x86_64 (signal one thread of a process)."""


@pytest.mark.parametrize("to", ["process", "stop thread"])
def test_an_interrupted_teardown_leaves_no_role_and_no_bound_port(tmp_path: Path, to: str) -> None:
    launcher, driver, pids = tmp_path / "launcher.py", tmp_path / "driver.py", tmp_path / "pids"
    launcher.write_text(LAUNCHER)
    driver.write_text(DRIVER)
    runtime_port, vllm_port = free_port(), free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO / "images" / "runtime")}
    argv = [sys.executable, str(driver), str(REPO / "bench" / "gpu" / "run.py"), str(launcher),
            str(runtime_port), str(vllm_port), str(pids), str(tmp_path)]  # fmt: skip
    # started with SIGINT ignored, as a shell starts a background job: run.py must hear the SIGINT all the same
    argv = ["/bin/sh", "-c", 'trap "" INT; exec "$@"', "sh", *argv]
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    role_pids: list[int] = []
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.strip() == "stopping", line + proc.stdout.read()
        role_pids = [int(p) for p in pids.read_text().split()]
        time.sleep(1.0)  # inside stop_roles: SIGTERM sent, the "vLLM" draining
        interrupt(proc.pid, to)  # gpu-burst.sh's `timeout --signal=INT`
        t_int = time.monotonic()
        try:
            proc.wait(KILL_AFTER_S)
        except subprocess.TimeoutExpired:
            proc.kill()  # `timeout -k`: what the machine does to a teardown that does not end
            proc.wait(5)
        took = time.monotonic() - t_int
        output = proc.stdout.read()
        # the interrupt still reaches the caller (the results are written), within gpu-burst.sh's kill bound
        assert "KeyboardInterrupt" in output, f"driver killed {took:.1f} s after SIGINT; its output: {output!r}"
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline and (listening(runtime_port) or listening(vllm_port)):
            time.sleep(0.1)
        assert not listening(runtime_port), "the launcher still holds its runtime port"
        assert not listening(vllm_port), "vLLM (its own session) still holds its port"
        assert not [p for p in role_pids if alive(p)]
    finally:
        if not role_pids and pids.exists():  # a driver that failed before the interrupt: its role is still up
            role_pids = [int(p) for p in pids.read_text().split()]
        for p in role_pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, signal.SIGKILL)
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)


def test_stop_role_returns_once_the_launcher_below_the_wrapper_has_let_go_of_its_port(tmp_path: Path) -> None:
    wrapper, launcher = tmp_path / "wrapper.py", tmp_path / "launcher.py"
    wrapper.write_text(WRAPPER)
    launcher.write_text(SLOW_LAUNCHER)
    from tests.unit.test_bench_gpu_decode_restart import load_run

    run = load_run("bench_gpu_run_stop_wrapper")
    runtime_port, vllm_port = free_port(), free_port()
    run.PORTS["decode"].update(vllm=vllm_port, runtime=runtime_port)
    role = run.Role("decode", [sys.executable, str(wrapper), sys.executable, str(launcher), str(runtime_port)], {}, 1)
    run.start_role(role, tmp_path, "t", {"PATH": os.environ["PATH"]})
    try:
        deadline = time.monotonic() + 20
        while not listening(runtime_port):
            assert time.monotonic() < deadline and role.proc.poll() is None, role.log.read_text()
            time.sleep(0.05)
        run.stop_role(role, 30.0)
        assert role.proc.returncode == -signal.SIGTERM  # the wrapper ended at once, as nsenter does
        assert not listening(runtime_port), "stop_role returned while the launcher still held its runtime port"
    finally:
        run.kill_tree(role, [])
