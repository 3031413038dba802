"""`python -m hpd_devcluster up|down|restart|env|status|build`: the local control plane for tests and the demo."""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time

from hpd_devcluster import build, cluster, lifecycle, lws, nodenet, realnode


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hpd_devcluster", description=__doc__)
    parser.add_argument("--name", default=cluster.DEFAULT_NAME, help="cluster name (several can run side by side)")
    sub = parser.add_subparsers(dest="command", required=True)
    p_up = sub.add_parser("up", help="build binaries if missing, start the cluster, wait until nodes are Ready")
    p_up.add_argument("--nodes", type=int, default=4, help="number of fake GPU nodes")
    p_up.add_argument("--gpus-per-node", type=int, default=8)
    p_up.add_argument("--gpu-product", default="NVIDIA-H200", help="value of the nvidia.com/gpu.product label")
    p_up.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for a Ready cluster")
    p_up.add_argument(
        "--real-node",
        action="store_true",
        help="also a real node (kubelet + containerd + CNI bridge; root; hack/real-node-tools.sh installs its packages)",
    )
    sub.add_parser("down", help="stop every process `up` started and delete the cluster's data")
    sub.add_parser(
        "load-images",
        help="build the operator and router images and the engine stand-in if changed, import them into the real "
        "node's containerd; print their references as JSON",
    )
    p_restart = sub.add_parser("restart", help="stop one process of the running cluster and start it again, same flags")
    p_restart.add_argument("process", choices=cluster.PROCESS_ORDER)
    sub.add_parser("env", help="print `export KUBECONFIG=... PATH=...` for eval")
    sub.add_parser("status", help="print PIDs, ports and health as JSON; exit 1 if not healthy")
    p_build = sub.add_parser("build", help="only build/fetch the binaries into the cache")
    p_build.add_argument(
        "--test-tools",
        action="store_true",
        help="also the tests' tools (cyclonus, the NetworkPolicy evaluator; LeaderWorkerSet, for multi-node roles; the "
        "real node's kubelet and pause)",
    )
    args = parser.parse_args(argv)

    try:
        if args.command == "build":
            bins = build.ensure_binaries()
            paths = {k: str(v) for k, v in bins.all().items()}
            if args.test_tools:
                paths["cyclonus"] = str(build.ensure_cyclonus())
                paths["lws"] = str(lws.ensure_built() / "lws-manager")
                paths["kubelet"] = str(realnode.ensure_built() / "kubelet")
                paths["coredns"] = str(nodenet.ensure_coredns())
            print(json.dumps(paths, indent=2))
        elif args.command == "up":
            _up(args)
        elif args.command == "load-images":
            return _load_images(args.name)
        elif args.command == "down":
            stopped = lifecycle.down(args.name)
            print(f"stopped: {', '.join(stopped) or 'nothing was running'}", file=sys.stderr)
        elif args.command == "restart":
            running = cluster.ClusterState.load(args.name)
            if running is None:
                print(f"no cluster {args.name!r}; run: python -m hpd_devcluster up", file=sys.stderr)
                return 1
            t0 = time.monotonic()
            cluster.restart(running, args.process)
            print(f"{args.process} serves again after {time.monotonic() - t0:.1f} s", file=sys.stderr)
        elif args.command == "env":
            loaded = cluster.ClusterState.load(args.name)
            if loaded is None:
                print(f"no cluster {args.name!r}; run: python -m hpd_devcluster up", file=sys.stderr)
                return 1
            for key, value in cluster.env(loaded).items():
                print(f"export {key}={shlex.quote(value)}")
        elif args.command == "status":
            current = cluster.ClusterState.load(args.name)
            if current is None:
                print(json.dumps({"name": args.name, "running": False}))
                return 1
            ok = cluster.healthy(current)
            info = {"name": current.name, "healthy": ok, "server": current.server, "pids": current.pids,
                    "ports": current.ports, "kubeconfig": str(current.kubeconfig)}  # fmt: skip
            print(json.dumps(info, indent=2))
            return 0 if ok else 1
    except (build.BuildError, cluster.ClusterError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


def _up(args: argparse.Namespace) -> None:
    t0 = time.monotonic()
    pool = cluster.NodePool(count=args.nodes, gpus_per_node=args.gpus_per_node, gpu_product=args.gpu_product)
    state = lifecycle.up(args.name, pool, timeout=args.timeout)
    if args.real_node:
        # no kwok node: every pod runs on the real node (the demo), which then advertises GPUs for them
        alone = args.nodes == 0
        realnode.start(state, timeout=args.timeout, taint=not alone, gpus=8 if alone else 0)
        print(f"real node {realnode.NODE_NAME!r} Ready (pods on {realnode.POD_CIDR})", file=sys.stderr)
    print(f"cluster {state.name!r} ready in {time.monotonic() - t0:.1f} s: {state.server}", file=sys.stderr)
    print(f"  kubeconfig: {state.kubeconfig}\n  logs: {state.logs}", file=sys.stderr)


def _load_images(name: str) -> int:
    state = cluster.ClusterState.load(name)
    if state is None:
        print(f"no cluster {name!r}; run: python -m hpd_devcluster up --real-node", file=sys.stderr)
        return 1
    from hpd_devcluster import images

    try:
        print(json.dumps(realnode.load_images(state), indent=2))
    except images.ImageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
