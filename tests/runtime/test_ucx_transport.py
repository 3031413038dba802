"""Which transport UCX chose for decode's KV reads (issue #43): read from UCX's protocol tables in vLLM's output,
passed through the launcher unchanged, and named in decode's KV path report."""

from __future__ import annotations

import io
import threading

import pytest

from hpd_runtime import contract as c
from hpd_runtime import kvstats, launcher, ucx_transport
from hpd_runtime.config import RuntimeConfig, load_config
from hpd_runtime.pairing import PairMonitor
from hpd_runtime.readiness import RuntimeMetrics, RuntimeState

# As UCX 1.23.0 (nixl-cu13 1.5.1) printed them on the H200 (bench/results/2026-12-01-kv-path-1gpu.json's run):
# an endpoint row, an operation row, the column titles, the ranges; an AM table that is not a GPU read; and the
# same GET table again from another thread, without separators, at the end of the output.
EMULATED = """\
[1796159379.574357] [vm:510  :0]     ucp_context.c:2753 UCX  INFO  Version 1.23.0 (loaded from /tmp/site/x/libucp.so)
[1796159380.566214] [vm:510  :0]   +--------+--------------------+-----------------------------------------+
[1796159380.566214] [vm:510  :0]   | kvp-d intra-node cfg#2                                                |
[1796159380.566214] [vm:510  :0]   | remote memory read by ucp_get*(multi) into cuda/GPU0 from cuda/dev[1] |
[1796159380.566214] [vm:510  :0]   +--------+--------------------+-----------------------------------------+
[1796159380.566214] [vm:510  :0]   | Range  |    Description     |                 Config                  |
[1796159380.566214] [vm:510  :0]   +--------+--------------------+-----------------------------------------+
[1796159380.566214] [vm:510  :0]   | 0..inf | software emulation | tcp/lo                                  |
[1796159380.566214] [vm:510  :0]   +--------+--------------------+-----------------------------------------+
INFO 12-03 08:00:01 [core.py:123] a vLLM line between two tables
[1796159380.929706] [vm:510  :0]   +------------+--------------------+--------------------+
[1796159380.929706] [vm:510  :0]   | kvp-d intra-node cfg#2                                |
[1796159380.929706] [vm:510  :0]   | active message by ucp_am_send* from host memory       |
[1796159380.929706] [vm:510  :0]   | 0..inf     | multi-frag copy-in | tcp/lo             |
"""
ZERO_COPY = EMULATED.replace("| software emulation | tcp/lo                                  |",
                             "| zero-copy          | cuda_ipc/cuda                           |")  # fmt: skip
# the header as one row (endpoint and operation), several ranges, vLLM's child-process prefix before UCX's
RDMA_ONE_ROW_HEADER = """\
(EngineCore_DP0 pid=77) [1.0] [h:77:0]   +---------------+---------------------------------------------------+
(EngineCore_DP0 pid=77) [1.0] [h:77:0]   | ucp_context_0 inter-node cfg#4 | remote memory read by ucp_get*(multi) into cuda/GPU0 from cuda/dev[1] |
(EngineCore_DP0 pid=77) [1.0] [h:77:0]   +---------------+------------------------+------------------------+
(EngineCore_DP0 pid=77) [1.0] [h:77:0]   |       0..8184 | copy-in                | rc_mlx5/mlx5_0:1       |
(EngineCore_DP0 pid=77) [1.0] [h:77:0]   |    8185..inf | zero-copy              | rc_mlx5/mlx5_0:1       |
(EngineCore_DP0 pid=77) [1.0] [h:77:0]   +---------------+------------------------+------------------------+
"""  # fmt: skip


@pytest.mark.parametrize(
    ("log", "transport", "protocol", "config"),
    [
        (EMULATED, "tcp emulation", "software emulation", "tcp/lo"),
        (ZERO_COPY, "cuda_ipc", "zero-copy", "cuda_ipc/cuda"),
        (RDMA_ONE_ROW_HEADER, "rdma", "zero-copy", "rc_mlx5/mlx5_0:1"),
    ],
)
def test_the_table_of_a_gpu_read_names_the_transport(log: str, transport: str, protocol: str, config: str) -> None:
    choices = ucx_transport.choices_in(log)
    assert len(choices) == 1  # the AM table is no GPU read; a repeated table is one choice
    ch = choices[0]
    assert (ch.op, ch.transport, ch.protocol, ch.config) == ("read", transport, protocol, config)
    assert ch.operation == "remote memory read by ucp_get*(multi) into cuda/GPU0 from cuda/dev[1]"


def test_the_largest_messages_decide_and_a_table_without_separators_still_counts() -> None:
    # the RDMA table's small messages are copy-in: the KV blocks (>= 16 KiB) take the last range
    assert ucx_transport.choices_in(RDMA_ONE_ROW_HEADER)[0].size_range == "8185..inf"
    bare = "\n".join(ln for ln in ZERO_COPY.splitlines() if "+---" not in ln)
    assert [ch.transport for ch in ucx_transport.choices_in(bare)] == ["cuda_ipc"]


def test_a_host_memory_read_or_unrelated_output_is_no_choice() -> None:
    host = EMULATED.replace("into cuda/GPU0 from cuda/dev[1]", "into host memory from host")
    assert ucx_transport.choices_in(host) == []
    assert ucx_transport.choices_in("INFO a | b | c\nplain text\n") == []


def test_the_watch_reports_a_change_of_transport_when_the_table_ends() -> None:
    w = ucx_transport.Watch()
    got = [ch for ch in (w.feed(line) for line in (EMULATED + ZERO_COPY).splitlines()) if ch is not None]
    assert [ch.transport for ch in got] == ["tcp emulation", "cuda_ipc"]
    assert w.latest() is not None and w.latest() == got[-1]


@pytest.mark.parametrize(("value", "on"), [(None, False), ("", False), ("n", False), ("y", True), ("*get*", True)])
def test_proto_info_enabled(value: str | None, on: bool) -> None:
    assert ucx_transport.proto_info_enabled(value) is on


def _cfg(role: str) -> RuntimeConfig:
    return load_config({c.ENV_ROLE: role, c.ENV_MODEL: "m"})


def test_decode_asks_ucx_for_its_tables_unless_the_pod_says_otherwise() -> None:
    assert launcher.transport_env(_cfg("decode"), {}) == {"UCX_PROTO_INFO": "y"}
    assert launcher.transport_env(_cfg("decode"), {"UCX_PROTO_INFO": "n"}) == {}
    assert launcher.transport_env(_cfg("prefill"), {}) == {}
    assert launcher.captures_ucx_transport(_cfg("decode"), {"UCX_PROTO_INFO": "y"})
    assert not launcher.captures_ucx_transport(_cfg("decode"), {"UCX_PROTO_INFO": "n"})
    assert not launcher.captures_ucx_transport(_cfg("prefill"), {"UCX_PROTO_INFO": "y"})


def test_the_forwarder_copies_vllm_output_unchanged_and_reports_the_transport() -> None:
    src, dst = io.BytesIO((EMULATED + ZERO_COPY).encode()), io.BytesIO()
    state = RuntimeState(RuntimeMetrics())
    seen: list[str] = []

    def on_choice(ch: ucx_transport.Choice) -> None:
        seen.append(ch.transport)
        launcher.report_transport(state)(ch)

    launcher.forward_output(src, dst, on_choice)
    assert dst.getvalue() == (EMULATED + ZERO_COPY).encode()
    assert seen == ["tcp emulation", "cuda_ipc"] and state.kv_transport() == "cuda_ipc"
    # the metric names the transport in use, and only that one (HPDKVPathTCPEmulation reads it)
    samples = {s.labels["transport"]: s.value for m in state.metrics.registry.collect() if m.name ==
               "hpd_runtime_kv_transport" for s in m.samples}  # fmt: skip
    assert samples == {"cuda_ipc": 1.0}


def _monitor(state: RuntimeState, **env: str) -> PairMonitor:
    cfg = load_config({c.ENV_ROLE: "decode", c.ENV_MODEL: "m", c.ENV_WARMUP_PAIR_CHECK: "true",
                       c.ENV_PREFILL_SERVICE: "p.ns.svc", **env})  # fmt: skip
    return PairMonitor(cfg, state, None, threading.Event(), resolver=lambda s, p: [])  # type: ignore[arg-type]


SLOW = kvstats.KVSpan(bytes=16 * 178e6, seconds=16 * 0.45, transfers=16, failed=0)


def test_the_kv_report_names_the_transport_and_why_tcp_emulation_is_slow() -> None:
    state = RuntimeState(RuntimeMetrics())
    state.set_kv_transport("tcp emulation")
    _monitor(state, **{c.ENV_KV_FLOOR_BYTES_PER_SECOND: "5e9"}).record_kv(SLOW)
    report = state.kv_report()
    assert report is not None and "UCX transport tcp emulation" in report
    assert "separate PID namespaces" in report and "below the 5 GB/s floor" in report
    assert "did UCX fall back" not in report  # the transport is known: no guess


def test_without_the_table_the_report_keeps_the_guess() -> None:
    state = RuntimeState(RuntimeMetrics())
    _monitor(state, **{c.ENV_KV_FLOOR_BYTES_PER_SECOND: "5e9"}).record_kv(SLOW)
    report = state.kv_report()
    assert report is not None and "UCX transport" not in report and "did UCX fall back to TCP?" in report
