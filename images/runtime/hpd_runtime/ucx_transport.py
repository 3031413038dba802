"""Which transport UCX chose for the KV transfers, read from UCX's own protocol tables.

With `UCX_PROTO_INFO=y` UCX prints, once per endpoint configuration and operation, the protocol it selected for
each message-size range (`src/ucp/proto/proto_debug.c`, `ucp_proto_select_elem_trace`; printed with
`ucs_log_print_compact`, so at any UCX_LOG_LEVEL):

    +---------------+--------------------------------------------------------------+
    | ucp_context_0 intra-node cfg#2 | remote memory read by ucp_get*(multi) into cuda/GPU0 from cuda/dev[1] |
    +---------------+--------------------------------------+-----------------------+
    |        0..inf | zero-copy                            | cuda_ipc/cuda         |
    +---------------+--------------------------------------+-----------------------+

(UCX 1.23 prints the endpoint name and the operation as one header row or as two; both are read.) vLLM 0.20's
NixlConnector READs on decode (`ucp_get*` into decode's VRAM), its push connector WRITEs on prefill (`ucp_put*`
from VRAM), so the table of a remote read or write of CUDA memory says what the KV blocks travel over:

- `zero-copy | cuda_ipc/cuda`: CUDA IPC, the fast same-node path (prefill and decode in one PID namespace);
- `software emulation | tcp/...`: active messages over TCP, the ~0.4 GB/s path (cuda_ipc unreachable: separate PID
  namespaces, i.e. separate pods, or GET zero-copy off: docs/kv-path.md);
- `zero-copy | rc_mlx5/...` (rc, dc, ud, ib, gga): RDMA.

Pure line parsing (`Watch.feed`), thread-safe; the launcher feeds it decode's vLLM output, the bench its logs.
"""

from __future__ import annotations

import dataclasses
import re
import threading

PROTO_INFO_ENV = "UCX_PROTO_INFO"
TCP_EMULATION = "tcp emulation"
TCP_EMULATION_WHY = (
    "GPU memory moves as active messages over TCP: cuda_ipc is unreachable when prefill and decode are in separate "
    "PID namespaces (separate pods) or on separate nodes without RDMA"
)
ANSI = re.compile(r"\x1b\[[0-9;]*m")
PREFIX = re.compile(r"^.*?(?=\|)")
"""Everything before the first `|`: UCX's `[ts] [host:pid:tid]` and vLLM's `(EngineCore pid=N)` prefixes."""
OP = re.compile(r"remote memory (read|write) by ucp_(?:get|put)\*?[^|]*?\b(?:into|from) (cuda|rocm|ze)\b", re.I)
SEPARATOR = re.compile(r"\+-{3,}(\+|-)*\s*$")
RANGE = re.compile(r"^\d[\d.]*\s*[KMGTB]?\s*\.\.\s*(\d[\d.]*\s*[KMGTB]?|inf)$", re.I)
RDMA = re.compile(r"^(rc|dc|ud|ib|gga|rdmacm|srd)(_|/|$)", re.I)


@dataclasses.dataclass(frozen=True)
class Choice:
    """The protocol UCX selected for the largest messages of one remote read/write of GPU memory."""

    op: str
    """`read` (decode pulls, vLLM 0.20) or `write` (prefill pushes)."""
    operation: str
    """UCX's own words: `remote memory read by ucp_get*(multi) into cuda/GPU0 from cuda/dev[1]`."""
    size_range: str
    protocol: str
    """`zero-copy`, `software emulation`, ..."""
    config: str
    """The transport/device: `cuda_ipc/cuda`, `tcp/lo`, `rc_mlx5/mlx5_0:1`."""

    @property
    def transport(self) -> str:
        """`cuda_ipc`, `tcp emulation`, `rdma`, or UCX's `protocol over config` where none of those fits."""
        tls = [t.strip() for t in re.split(r"[,\s]+", self.config) if t.strip()]
        names = [t.split("/", 1)[0].lower() for t in tls]
        if "emulation" in self.protocol.lower():
            return TCP_EMULATION if any(n.startswith("tcp") for n in names) else f"emulation over {self.config}"
        if names and all(n == "cuda_ipc" for n in names):
            return "cuda_ipc"
        if names and all(RDMA.match(n) for n in names):
            return "rdma"
        return f"{self.protocol} over {self.config}"

    def describe(self) -> str:
        """`cuda_ipc (zero-copy | cuda_ipc/cuda)`."""
        return f"{self.transport} ({self.protocol} | {self.config})"


class Watch:
    """Fed lines of UCX output one at a time; remembers the latest choice for a remote read/write of GPU memory."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._operation: str | None = None
        self._rows: list[tuple[str, str, str]] = []
        self._latest: Choice | None = None
        self.choices: list[Choice] = []
        """Every distinct choice seen, in order."""

    def feed(self, line: str) -> Choice | None:
        """One line of output; returns a new Choice when the line ends a table of a GPU remote read/write."""
        body = ANSI.sub("", line).strip()
        if SEPARATOR.search(body):  # `+----+----+`: after the header (no rows yet) or at the table's end
            with self._lock:
                ended = bool(self._rows)
            return self._close() if ended else None
        if "|" not in body:
            return None  # other output, possibly interleaved with the table by another thread or process
        body = PREFIX.sub("", body, count=1).strip()
        cells = [c.strip() for c in body.strip().strip("|").split("|")]
        if len(cells) >= 3 and RANGE.match(cells[0]):
            with self._lock:
                if self._operation is not None:
                    self._rows.append((cells[0], cells[1], cells[2]))
            return None
        if cells[0].lower() == "range":
            return None  # the column titles
        # a header row: the endpoint's name, the operation, or both; it ends the table before it
        done = self._close()
        op = next((c for c in cells if OP.search(c)), None)
        if op is not None:
            with self._lock:
                self._operation, self._rows = op, []
        return done

    def _close(self) -> Choice | None:
        """End of a table: the row of the largest messages (the last one) is the KV path's protocol."""
        with self._lock:
            operation, rows = self._operation, self._rows
            self._operation, self._rows = None, []
            if operation is None or not rows:
                return None
            rng, protocol, config = rows[-1]
            m = OP.search(operation)
            assert m is not None
            choice = Choice(m.group(1).lower(), operation, rng, protocol, config)
            self._latest = choice
            if choice not in self.choices:
                self.choices.append(choice)
            return choice

    def flush(self) -> Choice | None:
        """End of the output: close a table still open."""
        return self._close()

    def latest(self) -> Choice | None:
        with self._lock:
            return self._latest


def choices_in(text: str) -> list[Choice]:
    """Every distinct choice in a whole log."""
    w = Watch()
    for line in text.splitlines():
        w.feed(line)
    w.flush()
    return list(w.choices)


def proto_info_enabled(value: str | None) -> bool:
    """Whether `UCX_PROTO_INFO` (PROTO_INFO_ENV) asks UCX to print the tables (`y`/`yes`/`on`/`1`, or a pattern)."""
    v = (value or "").strip().lower()
    return bool(v) and v not in ("n", "no", "off", "0", "false")
