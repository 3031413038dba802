"""A failed build says which step failed and where its log is (no cluster needed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpd_devcluster import build, versions


def test_missing_go_names_the_step_and_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HPD_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))
    with pytest.raises(build.BuildError) as err:
        build.build_etcd(tmp_path, tmp_path / "logs")
    assert err.value.step == "etcd: go mod init"
    assert err.value.log == tmp_path / "logs" / f"etcd-v{versions.ETCD}.log"
    assert "'go' is not on PATH" in str(err.value)


def test_failed_module_download_names_the_step_and_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(versions, "ETCD", "0.0.0-does-not-exist")
    monkeypatch.setenv("HPD_CACHE_DIR", str(tmp_path))
    with pytest.raises(build.BuildError) as err:
        build.build_etcd(tmp_path, tmp_path / "logs")
    assert err.value.step == "etcd: go get"
    assert err.value.log.exists()
    assert "go.etcd.io/etcd/server/v3@v0.0.0-does-not-exist" in err.value.log.read_text()
    assert str(err.value.log) in str(err.value)
    assert not build.binaries(tmp_path).etcd.exists(), "a failed build leaves nothing half-installed in the cache"


def test_binaries_are_keyed_by_version(tmp_path: Path) -> None:
    bins = build.binaries(tmp_path)
    assert f"kubernetes-v{versions.KUBERNETES}" in str(bins.kube_apiserver)
    assert f"etcd-v{versions.ETCD}" in str(bins.etcd)
    assert f"kwok-v{versions.KWOK}" in str(bins.kwok)
    assert build.cyclonus_path(tmp_path).parent.name == f"cyclonus-v{versions.CYCLONUS}"  # a test tool, built apart
    assert build.missing(bins) == list(bins.all())
