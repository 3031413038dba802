"""One JSON object per line on stderr: easy to grep in `kubectl logs` and to parse in tests and benchmarks."""

from __future__ import annotations

import json
import sys
import threading
import time
from typing import Any

_lock = threading.Lock()


def log_event(event: str, level: str = "info", **fields: Any) -> None:
    """Write `{"ts", "level", "logger": "hpd_runtime", "event", ...fields}` as one line."""
    record: dict[str, Any] = {"ts": round(time.time(), 3), "level": level, "logger": "hpd_runtime", "event": event}
    record.update(fields)
    line = json.dumps(record, default=str, sort_keys=False)
    with _lock:
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
