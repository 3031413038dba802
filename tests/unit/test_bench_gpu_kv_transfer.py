"""bench/gpu/run.py records vLLM's own KV transfer figures for every GPU run: decode's `KV Transfer metrics` log line
and its vllm:nixl_* metrics. The parsers, on the exact formats vLLM 0.20.0 produces."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[2]


def load_run() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_gpu_run_kv", REPO / "bench" / "gpu" / "run.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


run = load_run()

# vLLM 0.20.0's format: vllm/logger.py:22-26 (`%(levelname)s %(asctime)s [%(fileinfo)s:%(lineno)d] %(message)s`,
# dates `%m-%d %H:%M:%S`), the process prefix of vllm/utils/system_utils.py:209, the message of
# distributed/kv_transfer/kv_connector/v1/metrics.py:103 (`"KV Transfer metrics: %s"` over `", ".join(f"{k}={v}")`)
# and the keys, rounding and order of nixl/stats.py:114-123. The figures are the 9B-class measurement
# (~178 MB per transfer, 420-455 ms, 390-442 MB/s).
LINE = (
    "(APIServer pid=2231) INFO 11-30 14:02:11 [metrics.py:103] KV Transfer metrics: Num successful transfers=2, "
    "Avg xfer time (ms)=432.517, P90 xfer time (ms)=452.091, Avg post time (ms)=0.612, P90 post time (ms)=0.734, "
    "Avg MB per transfer=169.812, Throughput (MB/s)=392.612, Avg number of descriptors=1640.0"
)
EMPTY = (
    "(APIServer pid=2231) INFO 11-30 14:02:21 [metrics.py:103] KV Transfer metrics: Num successful transfers=0, "
    "Avg xfer time (ms)=0, P90 xfer time (ms)=0, Avg post time (ms)=0, P90 post time (ms)=0, Avg MB per transfer=0, "
    "Throughput (MB/s)=0, Avg number of descriptors=0"
)


def test_parse_kv_transfer_line() -> None:
    got = run.parse_kv_transfer_line(LINE)
    assert got == {
        "transfers": 2, "avg_xfer_ms": 432.517, "p90_xfer_ms": 452.091, "avg_post_ms": 0.612, "p90_post_ms": 0.734,
        "avg_mib_per_transfer": 169.812, "throughput_mib_s": 392.612, "avg_descriptors": 1640.0,
        "gbps": round(392.612 * 2**20 / 1e9, 4),
    }  # fmt: skip
    assert run.parse_kv_transfer_line("INFO 11-30 14:02:11 [loggers.py:259] Engine 000: Avg prompt throughput") is None
    assert run.parse_kv_transfer_line(EMPTY)["transfers"] == 0
    colored = "\x1b[36m(APIServer pid=7)\x1b[0m " + LINE.split(") ", 1)[1]
    assert run.parse_kv_transfer_line(colored)["avg_descriptors"] == 1640.0


def test_kv_transfer_log_weights_by_transfers() -> None:
    second = (
        LINE.replace("transfers=2", "transfers=6")
        .replace("(ms)=432.517", "(ms)=400.0")
        .replace("per transfer=169.812", "per transfer=170.0")
    )
    text = "\n".join(["noise", LINE, EMPTY, second])
    agg = run.kv_transfer_log(text)
    assert agg["transfers"] == 8 and len(agg["lines"]) == 2  # the empty interval is dropped
    xfer_s = 2 * 0.432517 + 6 * 0.400
    mib = 2 * 169.812 + 6 * 170.0
    assert math.isclose(agg["ms_per_transfer"], xfer_s / 8 * 1e3, abs_tol=1e-3)
    assert math.isclose(agg["mb_per_transfer"], mib * 2**20 / 8 / 1e6, abs_tol=1e-3)
    assert math.isclose(agg["gbps"], mib * 2**20 / xfer_s / 1e9, abs_tol=1e-4)
    assert agg["descriptors_per_transfer"] == 1640.0
    assert run.kv_transfer_log("no such line") == {"lines": [], "transfers": 0}


# vllm:nixl_* as prometheus_client exposes NixlPromMetrics (nixl/stats.py:130-264): histograms with _sum/_count,
# labels model_name and engine; counters with _total.
METRICS = """\
# HELP vllm:nixl_xfer_time_seconds Histogram of transfer duration for NIXL KV Cache transfers.
# TYPE vllm:nixl_xfer_time_seconds histogram
vllm:nixl_xfer_time_seconds_bucket{engine="0",le="0.5",model_name="nemotron-h"} 15.0
vllm:nixl_xfer_time_seconds_count{engine="0",model_name="nemotron-h"} 16.0
vllm:nixl_xfer_time_seconds_sum{engine="0",model_name="nemotron-h"} 6.92
vllm:nixl_post_time_seconds_count{engine="0",model_name="nemotron-h"} 16.0
vllm:nixl_post_time_seconds_sum{engine="0",model_name="nemotron-h"} 0.0096
vllm:nixl_bytes_transferred_count{engine="0",model_name="nemotron-h"} 16.0
vllm:nixl_bytes_transferred_sum{engine="0",model_name="nemotron-h"} 2.848e+09
vllm:nixl_num_descriptors_count{engine="0",model_name="nemotron-h"} 16.0
vllm:nixl_num_descriptors_sum{engine="0",model_name="nemotron-h"} 26240.0
vllm:nixl_num_failed_transfers_total{engine="0",model_name="nemotron-h"} 0.0
vllm:prompt_tokens_total{engine="0",model_name="nemotron-h"} 30000.0
"""


def test_parse_nixl_metrics() -> None:
    got = run.parse_nixl_metrics(METRICS)
    assert got == {
        "transfers": 16, "failed_transfers": 0, "present": True, "mb_per_transfer": 178.0,
        "ms_per_transfer": 432.5, "post_ms_per_transfer": 0.6, "descriptors_per_transfer": 1640.0,
        "gbps": round(2.848e9 / 6.92 / 1e9, 4),
    }  # fmt: skip
    assert run.parse_nixl_metrics("vllm:prompt_tokens_total 1.0\n") == {
        "transfers": 0,
        "failed_transfers": 0,
        "present": False,
    }


def test_nixl_delta_is_the_transfers_between_two_scrapes() -> None:
    """bench/load reads decode's /metrics before and after each probe: the figures of the transfers in between."""
    before = run.nixl_metric_sums(METRICS)
    after = dict(before)
    after.update({"vllm:nixl_xfer_time_seconds_count": 18.0, "vllm:nixl_xfer_time_seconds_sum": 6.92 + 0.01,
                  "vllm:nixl_bytes_transferred_sum": 2.848e9 + 2.0e8, "vllm:nixl_bytes_transferred_count": 18.0,
                  "vllm:nixl_num_descriptors_sum": before["vllm:nixl_num_descriptors_sum"] + 200})  # fmt: skip
    got = run.nixl_delta(before, after)
    assert got["transfers"] == 2 and got["mb_per_transfer"] == 100.0 and got["ms_per_transfer"] == 5.0
    assert got["gbps"] == 20.0 and got["descriptors_per_transfer"] == 100.0 and got["failed_transfers"] == 0
    assert run.nixl_delta(before, before)["transfers"] == 0
