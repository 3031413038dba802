"""`run --metrics-port-file`: the operator binds its metrics on a port the OS picks and writes the number to a
file, so that tests running several operators on one host read the port instead of picking a free one that
another process may take before the operator binds it (free-then-bind)."""

from __future__ import annotations

import urllib.request
from pathlib import Path

from hpd_operator import metrics as _metrics_registered  # noqa: F401  (the operator's series, as `run` has them)
from hpd_operator.__main__ import build_parser, serve_metrics

_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _metrics(port: int) -> str:
    with _NO_PROXY.open(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        return str(r.read().decode())


def test_the_option_parses_and_is_off_by_default() -> None:
    assert build_parser().parse_args(["run"]).metrics_port_file is None
    ns = build_parser().parse_args(["run", "--metrics-port-file", "/tmp/x/port"])
    assert ns.metrics_port_file == Path("/tmp/x/port")


def test_two_operators_each_bind_their_own_port_and_write_it(tmp_path: Path) -> None:
    files = [tmp_path / "a.port", tmp_path / "b.port"]
    servers = [serve_metrics(9090, f) for f in files]  # --metrics-port is not used when a port file is given
    try:
        ports = [int(f.read_text()) for f in files]
        assert [s.server_port for s in servers if s is not None] == ports
        assert len(set(ports)) == 2 and 9090 not in ports
        for port in ports:  # each file names a port that serves the operator's metrics
            assert "hpd_operator_" in _metrics(port)
        assert not list(tmp_path.glob("*.tmp"))  # written atomically, no half-written file left
    finally:
        for s in servers:
            if s is not None:
                s.shutdown()
                s.server_close()


def test_without_a_port_file_0_is_off(tmp_path: Path) -> None:
    assert serve_metrics(0, None) is None
    assert not list(tmp_path.iterdir())
