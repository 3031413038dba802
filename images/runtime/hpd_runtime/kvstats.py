"""What the KV path did during a span of time, from decode's own vLLM counters (pure parsing, one read helper).

vLLM's NixlConnector exports, on the reader (decode), per successful transfer: `vllm:nixl_bytes_transferred`
(histogram of bytes), `vllm:nixl_xfer_time_seconds` (histogram of NIXL's xferDuration) and
`vllm:nixl_num_failed_transfers` (counter). Two reads of decode's /metrics around a pair check give the bytes, the
transfer seconds and the transfers of exactly the check's requests (nothing else runs on a decode that is not Ready
yet; a canary on a serving decode shares the span with user requests, so its figure is the decode's rate over it).
"""

from __future__ import annotations

import dataclasses

from prometheus_client.parser import text_string_to_metric_families

from hpd_runtime.http_client import RequestError, base_url, request

BYTES = "vllm:nixl_bytes_transferred"
SECONDS = "vllm:nixl_xfer_time_seconds"
FAILED = "vllm:nixl_num_failed_transfers"


@dataclasses.dataclass(frozen=True)
class KVCounters:
    bytes: float = 0.0
    seconds: float = 0.0
    transfers: float = 0.0
    failed: float = 0.0


@dataclasses.dataclass(frozen=True)
class KVSpan:
    """The KV transfers between two reads."""

    bytes: float
    seconds: float
    transfers: float
    failed: float

    @property
    def bytes_per_second(self) -> float | None:
        return self.bytes / self.seconds if self.seconds > 0 else None

    @property
    def bytes_per_transfer(self) -> float | None:
        return self.bytes / self.transfers if self.transfers > 0 else None

    def describe(self, fabric: str) -> str:
        """`KV moved at 21.3 GB/s, 178 MB per request over rdma (16 transfers)`."""
        rate, per = self.bytes_per_second, self.bytes_per_transfer
        if rate is None or per is None:
            return f"no KV transfer was measured (fabric {fabric})"
        return (
            f"KV moved at {rate / 1e9:.3g} GB/s, {per / 1e6:.3g} MB per request over {fabric} "
            f"({self.transfers:.0f} transfers)"
        )


def parse(text: str) -> KVCounters | None:
    """The NIXL counters in one /metrics text, summed over engines; None when vLLM exports none (no connector)."""
    seen, values = False, {"bytes": 0.0, "seconds": 0.0, "transfers": 0.0, "failed": 0.0}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == f"{BYTES}_sum":
                values["bytes"] += s.value
                seen = True
            elif s.name == f"{BYTES}_count":
                values["transfers"] += s.value
            elif s.name == f"{SECONDS}_sum":
                values["seconds"] += s.value
            elif s.name == f"{FAILED}_total":
                values["failed"] += s.value
    return KVCounters(**values) if seen else None


def span(before: KVCounters | None, after: KVCounters | None) -> KVSpan | None:
    if before is None or after is None:
        return None
    return KVSpan(
        bytes=after.bytes - before.bytes,
        seconds=after.seconds - before.seconds,
        transfers=after.transfers - before.transfers,
        failed=after.failed - before.failed,
    )


def read(host: str, port: int, timeout: float = 5.0) -> KVCounters | None:
    """Decode's vLLM counters now (None: no answer, or no NIXL metrics)."""
    try:
        resp = request("GET", base_url(host, port) + "/metrics", timeout=timeout)
    except RequestError:
        return None
    if resp.status != 200 or not isinstance(resp.body, str):
        return None
    return parse(resp.body)
