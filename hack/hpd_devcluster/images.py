"""Build our three images for real on this machine (no registry, no Docker daemon) and run commands inside them.

Tools: Debian's `buildah` (vfs storage driver, chroot isolation, as root) and `mmdebstrap`
(hack/image-tools.sh installs both). Everything is stored outside the repository, under
`<cache>/buildah/` (`<cache>` as in `build.cache_dir()`), so warm runs and CI reuse it.

The published Dockerfiles start from images we cannot pull here (`python:3.x-slim-bookworm`, `vllm/vllm-openai`),
so each base is a build-arg and is swapped for local stand-ins built from Debian packages:

- `localhost/hpd-base:<hash>`: Debian bookworm (mmdebstrap, minbase) + python3, pip, `python` -> python3, with
  Debian's "externally managed" marker removed, so `python -m pip install` behaves as in `python:*-slim`.
- `localhost/hpd-vllm-standin:<hash>`: the base + a metadata-only `torch` distribution standing for the torch that
  `vllm/vllm-openai` ships (nixl's backend wheels require torch; pip then resolves them as it does on vLLM's image
  instead of downloading 3 GB of CUDA torch). It has no torch code: nothing that imports torch is checked here.

Each image is tagged by a content hash of its inputs (Dockerfile, the files it copies, the sources the wheel is
built from, build-args, the base's hash), so a warm `ensure_image` costs one `buildah inspect`.

    python -m hpd_devcluster.images build operator|router|vllm      # prints the image reference
    python -m hpd_devcluster.images run IMAGE [--env K=V] [--mount HOST:CTR] -- ARGV...
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, get_args

import yaml

from hpd_devcluster.build import cache_dir

ImageName = Literal["operator", "router", "vllm"]
IMAGE_NAMES: tuple[ImageName, ...] = get_args(ImageName)

REPO = Path(__file__).resolve().parents[2]
DEBIAN_SUITE = "bookworm"
DEBIAN_MIRROR = "http://deb.debian.org/debian"
BASE_PACKAGES = ("python3", "python3-pip", "python3-venv", "python-is-python3", "ca-certificates")
TORCH_STANDIN_VERSION = "2.11.0"
"""The torch that vLLM 0.20.0 pins (shared/reference/vllm-facts.md); only its metadata is installed."""

WHEEL_SOURCES = ("pyproject.toml", "operator/hpd_operator", "images/runtime/hpd_runtime")
"""Everything the project wheel is built from here (tests/images/test_wheel_contents.py checks hack/ is not in it).
README.md, the wheel's long description, is replaced by a stub so that editing it does not rebuild the images."""

# The base's customize hook: runs on the host with the chroot as $1. Part of the base's hash.
_BASE_HOOK = (
    'rm -f "$1"/usr/lib/python3*/EXTERNALLY-MANAGED; '
    'rm -rf "$1"/var/cache/apt/archives/*.deb "$1"/var/lib/apt/lists/* "$1"/usr/share/doc/* "$1"/usr/share/man/*'
)


BUD_FLAGS = (
    "--format", "docker",  # as `docker build`: the Dockerfiles' SHELL ["/bin/sh", "-eu", "-c"] applies (OCI drops it)
    "--isolation", "chroot",
    "--network", "host",
    "--pull-never",  # bases are local; nothing is pulled
    "--layers=false",  # one commit per image: with vfs every layer is a full copy of the root filesystem
    "--volume", "/etc/ssl/certs:/etc/ssl/certs:ro",  # the host's trust store, during RUN steps only (TLS egress proxy)
)  # fmt: skip
"""`buildah bud` flags; part of each image's hash."""


class ImageError(RuntimeError):
    """A build step failed; the message names the step and the log holding its output."""


@dataclass(frozen=True)
class Spec:
    dockerfile: Path
    base_arg: str
    copies: tuple[str, ...]  # repository paths the Dockerfile COPYs (besides dist/)
    needs_wheel: bool
    standin: bool  # base = the vLLM stand-in instead of the plain base


SPECS: dict[ImageName, Spec] = {
    "operator": Spec(REPO / "images/operator/Dockerfile", "PYTHON_IMAGE", ("images/install-wheel.sh",), True, False),
    "router": Spec(REPO / "images/router/Dockerfile", "PYTHON_IMAGE", ("images/router/retry.cfg",), False, False),
    "vllm": Spec(REPO / "images/vllm/Dockerfile", "VLLM_IMAGE", ("images/install-wheel.sh",), True, True),
}


def root() -> Path:
    return cache_dir() / "buildah"


def buildah() -> list[str]:
    """`buildah` with our storage (vfs, under the cache) and chroot isolation: no daemon, no overlay, no registry."""
    exe = shutil.which("buildah")
    if exe is None:
        raise ImageError("buildah is not installed: run hack/image-tools.sh (apt-get install buildah mmdebstrap)")
    r = root()
    return [exe, "--root", str(r / "storage"), "--runroot", str(r / "run"), "--storage-driver", "vfs"]


def _env() -> dict[str, str]:
    return {**os.environ, "BUILDAH_ISOLATION": "chroot", "STORAGE_DRIVER": "vfs"}


def _run(step: str, argv: Sequence[str], capture: bool = False) -> str:
    """Run a tool with its output in `<root>/logs/<step>.log` (named in the error when it fails).

    With `capture`, stdout is returned instead of logged (for `buildah from`, which prints the container name).
    """
    log = root() / "logs" / f"{step}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as out:
        out.write("$ " + " ".join(argv) + "\n")
        out.flush()
        stdout = subprocess.PIPE if capture else out
        proc = subprocess.run(argv, stdout=stdout, stderr=out, text=True, env=_env(), check=False)
    if proc.returncode != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-20:])
        raise ImageError(f"{step} failed (exit {proc.returncode}); full log: {log}\n{tail}")
    return proc.stdout or ""


def _hash(*parts: bytes | str) -> str:
    h = hashlib.sha256()
    for part in parts:
        data = part.encode() if isinstance(part, str) else part
        h.update(len(data).to_bytes(8, "big") + data)
    return h.hexdigest()[:16]


def _tree_hash(paths: Sequence[str]) -> str:
    """Hash of the named files and of every file under the named folders (caches excluded), by relative path."""
    parts: list[bytes | str] = []
    for rel in paths:
        top = REPO / rel
        files = [top] if top.is_file() else sorted(p for p in top.rglob("*") if p.is_file())
        for f in files:
            if "__pycache__" in f.parts or f.suffix == ".pyc" or ".mypy_cache" in f.parts:
                continue
            parts += [str(f.relative_to(REPO)), f.read_bytes()]
    return _hash(*parts)


def exists(ref: str) -> bool:
    argv = [*buildah(), "inspect", "--type", "image", "--format", "{{.FromImageID}}", ref]
    return subprocess.run(argv, capture_output=True, env=_env(), check=False).returncode == 0


@contextlib.contextmanager
def _lock(name: str) -> Iterator[None]:
    """One builder per image at a time (tests and other shells may call ensure_image concurrently)."""
    path = root() / "locks" / f"{name}.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as fd:
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)


def _log(msg: str) -> None:
    print(f"[hpd-images] {msg}", file=sys.stderr, flush=True)


# --- bases ----------------------------------------------------------------------------------------------------------


def base_image() -> str:
    """The Debian bookworm + python3 base (built with mmdebstrap once per hash of its recipe)."""
    ref = "localhost/hpd-base:" + _hash(DEBIAN_SUITE, DEBIAN_MIRROR, *BASE_PACKAGES, _BASE_HOOK)
    with _lock("base"):
        if exists(ref):
            return ref
        exe = shutil.which("mmdebstrap")
        if exe is None:
            raise ImageError("mmdebstrap is not installed: run hack/image-tools.sh")
        t0 = time.monotonic()
        _log(f"building {ref} with mmdebstrap (Debian {DEBIAN_SUITE} + python3) ...")
        with tempfile.TemporaryDirectory(prefix="hpd-base-") as tmp:
            tar = Path(tmp) / "rootfs.tar"
            _run(
                "base-mmdebstrap",
                [exe, "--variant=minbase", "--mode=root", "--format=tar", "--aptopt=APT::Install-Recommends false",
                 "--include=" + ",".join(BASE_PACKAGES), f"--customize-hook={_BASE_HOOK}",
                 DEBIAN_SUITE, str(tar), DEBIAN_MIRROR],
            )  # fmt: skip
            ctr = _run("base-from", [*buildah(), "from", "scratch"], capture=True).strip()
            try:
                _run("base-add", [*buildah(), "add", ctr, str(tar), "/"])
                _run(
                    "base-config",
                    [*buildah(), "config", "--env", "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                     "--env", "LANG=C.UTF-8", "--cmd", "python3", "--os", "linux", "--arch", "amd64", ctr],
                )  # fmt: skip
                _run("base-commit", [*buildah(), "commit", "--format", "docker", "--rm", ctr, ref])
            except BaseException:
                subprocess.run([*buildah(), "rm", ctr], capture_output=True, env=_env(), check=False)
                raise
        _log(f"built {ref} in {time.monotonic() - t0:.0f} s")
        return ref


def _torch_metadata(version: str) -> str:
    return f"Metadata-Version: 2.1\nName: torch\nVersion: {version}\nSummary: stand-in (metadata only)\n"


def vllm_standin_image() -> str:
    """The base + a metadata-only torch distribution (what pip sees of vLLM's image when resolving nixl)."""
    base = base_image()
    info = f"/usr/local/lib/python3.11/dist-packages/torch-{TORCH_STANDIN_VERSION}.dist-info"
    script = (
        f"mkdir -p {info} && printf '%s' \"$1\" > {info}/METADATA && echo pip > {info}/INSTALLER && "
        f"printf 'torch-{TORCH_STANDIN_VERSION}.dist-info/METADATA,,\\n' > {info}/RECORD && "
        "python3 -c 'import importlib.metadata as m; print(m.version(\"torch\"))'"
    )
    ref = "localhost/hpd-vllm-standin:" + _hash(base, script, _torch_metadata(TORCH_STANDIN_VERSION))
    with _lock("vllm-standin"):
        if exists(ref):
            return ref
        _log(f"building {ref} ...")
        ctr = _run("standin-from", [*buildah(), "from", "--pull-never", base], capture=True).strip()
        try:
            _run("standin-run", [*buildah(), "run", ctr, "--", "sh", "-euc", script, "sh",
                                 _torch_metadata(TORCH_STANDIN_VERSION)])  # fmt: skip
            _run("standin-commit", [*buildah(), "commit", "--format", "docker", "--rm", ctr, ref])
        except BaseException:
            subprocess.run([*buildah(), "rm", ctr], capture_output=True, env=_env(), check=False)
            raise
        return ref


# --- our images -----------------------------------------------------------------------------------------------------


def build_wheel(dist: Path) -> Path:
    """Build the project wheel from a copy of its sources (nothing is written into the working tree)."""
    with tempfile.TemporaryDirectory(prefix="hpd-wheel-src-") as tmp:
        src = Path(tmp)
        for rel in WHEEL_SOURCES:
            if (REPO / rel).is_file():
                shutil.copy2(REPO / rel, src / rel)
            else:
                shutil.copytree(REPO / rel, src / rel, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        (src / "README.md").write_text("hybrid-pd-operator (local build; the published wheel has the README)\n")
        _run("wheel", [sys.executable, "-m", "pip", "wheel", "--no-deps", "--wheel-dir", str(dist), str(src)])
    (wheel,) = dist.glob("hybrid_pd_operator-*.whl")
    return wheel


def image_ref(name: ImageName) -> tuple[str, str]:
    """(reference, base reference) for the current inputs; bases are built if missing (they are inputs)."""
    spec = SPECS[name]
    base = vllm_standin_image() if spec.standin else base_image()
    inputs = [name, spec.dockerfile.read_bytes(), spec.base_arg, base, *BUD_FLAGS, _tree_hash(spec.copies)]
    if spec.needs_wheel:
        inputs.append(_tree_hash(WHEEL_SOURCES))
    return f"localhost/hpd-{name}:{_hash(*inputs)}", base


def ensure_image(name: ImageName) -> str:
    """The local image reference of `name`, built with `buildah bud` only if its content hash changed."""
    if name not in SPECS:
        raise ValueError(f"unknown image {name!r}; expected one of {', '.join(IMAGE_NAMES)}")
    ref, base = image_ref(name)
    spec = SPECS[name]
    with _lock(name):
        if exists(ref):
            return ref
        t0 = time.monotonic()
        _log(f"building {ref} from {spec.dockerfile.relative_to(REPO)} on {base} ...")
        with tempfile.TemporaryDirectory(prefix=f"hpd-ctx-{name}-") as tmp:
            ctx = Path(tmp)  # a context with only what the Dockerfile COPYs (like its .dockerignore)
            for rel in spec.copies:
                (ctx / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(REPO / rel, ctx / rel)
            if spec.needs_wheel:
                build_wheel(ctx / "dist")
            _run(
                f"bud-{name}",
                [*buildah(), "bud", *BUD_FLAGS, "--build-arg", f"{spec.base_arg}={base}", "-f", str(spec.dockerfile), "-t", ref, str(ctx)],
            )  # fmt: skip
        _log(f"built {ref} in {time.monotonic() - t0:.0f} s")
        _prune(name)
        return ref


KEEP_PER_IMAGE = 4
"""Older builds of an image kept in the cache (several worktrees share it); vfs makes each one a full copy."""


def _prune(name: ImageName) -> None:
    """Remove all but the newest KEEP_PER_IMAGE builds of `name` (an image still in use is left alone)."""
    listed = subprocess.run(
        [*buildah(), "images", "--json", "--filter", f"reference=localhost/hpd-{name}"],
        capture_output=True, text=True, env=_env(), check=False,
    )  # fmt: skip
    if listed.returncode != 0 or not listed.stdout.strip():
        return
    found = sorted(json.loads(listed.stdout), key=lambda image: image.get("created", 0), reverse=True)
    for image in found[KEEP_PER_IMAGE:]:
        subprocess.run([*buildah(), "rmi", image["id"]], capture_output=True, env=_env(), check=False)


# --- running a command inside an image -------------------------------------------------------------------------------


def run_command(image: str, argv: list[str], env: dict[str, str], mounts: dict[str, str]) -> list[str]:
    """The argv for `subprocess.Popen` that runs `argv` inside `image` on the host network.

    The process runs as the image's USER (uid 1000 for ours) with the image's environment plus `env`; each
    `mounts` item binds host path -> container path read-only (e.g. a kubeconfig: make it self-contained and
    readable by that uid with `portable_kubeconfig`). It reaches a local apiserver on 127.0.0.1. A throw-away working container is created at start and
    removed at exit; SIGTERM/SIGINT to the returned process are forwarded to the command.
    """
    out = [sys.executable, "-m", "hpd_devcluster.images", "run", image]
    for key, value in env.items():
        out += ["--env", f"{key}={value}"]
    for host, ctr in mounts.items():
        out += ["--mount", f"{host}:{ctr}"]
    return [*out, "--", *argv]


_FILE_TO_DATA = {"certificate-authority": "certificate-authority-data", "client-certificate": "client-certificate-data",
                 "client-key": "client-key-data"}  # fmt: skip


def portable_kubeconfig(src: Path, dest: Path) -> Path:
    """Write `src` to `dest` with every referenced cert/key file inlined (`*-data`), mode 0644.

    For `run_command` mounts: inside the image only the one mounted file exists, and the image's user (uid 1000)
    must be able to read it. Treat `dest` as a secret (it holds the client key); put it in a private directory.
    """
    config = yaml.safe_load(src.read_text())
    for entry in [*config.get("clusters", []), *config.get("users", [])]:
        body = entry.get("cluster") or entry.get("user") or {}
        for key, data_key in _FILE_TO_DATA.items():
            if key in body:
                body[data_key] = base64.b64encode(Path(body.pop(key)).read_bytes()).decode()
    dest.write_text(json.dumps(config, indent=2))
    dest.chmod(0o644)
    return dest


def _run_inside(image: str, argv: list[str], env: list[str], mounts: list[str]) -> int:
    name = f"hpd-run-{uuid.uuid4().hex[:10]}"
    created = subprocess.run(
        [*buildah(), "from", "--pull-never", "--name", name, image],
        capture_output=True,
        text=True,
        env=_env(),
        check=False,
    )
    if created.returncode != 0:
        print(f"hpd_devcluster.images: cannot create a container from {image}: {created.stderr}", file=sys.stderr)
        return 125
    cmd = [*buildah(), "run", "--isolation", "chroot", "--network", "host"]
    for item in env:
        cmd += ["--env", item]
    for item in mounts:
        cmd += ["--volume", f"{item}:ro"]
    cmd += [name, "--", *argv]
    try:
        child = subprocess.Popen(cmd, env=_env(), start_new_session=True)

        def forward(signum: int, _frame: object) -> None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child.pid, signum)

        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, forward)
        return child.wait()
    finally:
        subprocess.run([*buildah(), "rm", name], capture_output=True, env=_env(), check=False)


def main(args: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hpd_devcluster.images", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p_build = sub.add_parser("build", help="build (if its inputs changed) and print the image reference")
    p_build.add_argument("name", choices=IMAGE_NAMES)
    p_run = sub.add_parser("run", help="run ARGV inside IMAGE on the host network")
    p_run.add_argument("image")
    p_run.add_argument("--env", action="append", default=[], metavar="KEY=VALUE")
    p_run.add_argument("--mount", action="append", default=[], metavar="HOST:CONTAINER", help="read-only bind")
    p_run.add_argument("argv", nargs="+")
    ns = parser.parse_args(args)
    try:
        if ns.command == "build":
            print(ensure_image(ns.name))
            return 0
        return _run_inside(ns.image, ns.argv, ns.env, ns.mount)
    except ImageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
