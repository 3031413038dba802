"""The vLLM version table: what hybrid P/D over NIXL needs on each vLLM minor, and the one version parser.

    row = version_row("0.25.1")                  # the rules covering 0.25; SpecError outside the table
    row.has("no-async-scheduling"), row.cite("equal-block-size")
    parse_version("v0.25.1-cu130", prefix=True)  # Version(0, 25, 1): an image tag, a flag list's name, a spec field
    image_version_warning(image, version)        # the image tag names another release than spec.vllmVersion

VERSION_RULES: one rule per fact over a range of vLLM minors (0.20-0.33), each citing its upstream PRs/issues;
status.profile.rules lists the rules that applied. A new vLLM release is a new range end or a new rule here.
Facts and their sources: shared/reference/vllm-upstream-2026-11.md (wins where they differ) and vllm-facts.md.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final, Literal

from hpd_operator.api import constants as c
from hpd_operator.errors import SpecError


# ---------------------------------------------------------------------------------------------------------------
# Version table: rules over ranges of vLLM minors (shared/reference/vllm-upstream-2026-11.md §1-§2, vllm-facts.md)
# ---------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class VersionRule:
    """One fact about hybrid P/D over NIXL that holds for vLLM 0.<first> through 0.<last> (inclusive)."""

    key: str
    first: int
    last: int
    upstream: str
    """The upstream numbers (vllm-project/vllm PRs/issues unless a repo is named) that justify the range."""
    note: str
    """What the rule means for a deployment (shown in status.profile.rules)."""
    hybrid_only: bool = True
    when: Literal["", "multi-node", "pipeline-parallel"] = ""
    """Listed in status.profile.rules only for a CR that has a role spanning nodes (`multi-node`) or a role with
    pipelineParallelSize > 1 (`pipeline-parallel`); "" = always."""

    def covers(self, minor: int) -> bool:
        return self.first <= minor <= self.last

    def applies(self, *, hybrid: bool, multi_node: bool, pipeline_parallel: bool) -> bool:
        """Whether status.profile.rules lists this rule for such a CR."""
        topic = {"": True, "multi-node": multi_node, "pipeline-parallel": pipeline_parallel}[self.when]
        return topic and (hybrid or not self.hybrid_only)

    @property
    def versions(self) -> str:
        return f"0.{self.first}" if self.first == self.last else f"0.{self.first}-0.{self.last}"


_FIRST, _LAST = c.VLLM_MINORS[0], c.VLLM_MINORS[-1]
VERSION_RULES: Final[tuple[VersionRule, ...]] = (
    VersionRule(
        key="ds-conv-state-layout",
        first=_FIRST,
        last=_LAST,
        upstream="#37416, #37635 (0.20); not the CUDA default in any release: #42882 closed, docs #54387/#54489",
        note="VLLM_SSM_CONV_STATE_LAYOUT=DS on both roles: the NIXL worker asserts the DS conv-state layout for "
        "Mamba models (only the CPU platform sets it itself)",
    ),
    VersionRule(
        key="hybrid-kv-cache-manager-flag",
        first=20,
        last=21,
        upstream="#35758 (HMA for NIXL); 0.20 config/vllm.py turns HMA off with --kv-transfer-config, kept on for "
        "SupportsHMA connectors (NixlConnector) from 0.22 (0.22.1 wheel)",
        note="--no-disable-hybrid-kv-cache-manager on both roles (NIXL with Mamba asserts HMA on); harmless later, "
        "so 0.21 (not read from a wheel) keeps it",
    ),
    VersionRule(
        key="no-async-scheduling",
        first=20,
        last=25,
        upstream="races #37285; fixed by #45357 (0.24) and #48481 + #48085 (0.26); prefill at TP > 1: #36687",
        note="--no-async-scheduling on decode, and on prefill when its TP > 1: async scheduling can overwrite or "
        "zero RDMA-loaded Mamba/KV state",
    ),
    VersionRule(
        key="equal-block-size",
        first=20,
        last=26,
        upstream="'Mamba 3-read transfer with block_size_ratio != 1 is not tested' (0.20-0.25.1); lifted by #49612 "
        "(0.27)",
        note="prefill and decode must end up with the same attention block size; different TP sizes that replicate "
        "KV heads or Mamba groups need spec.blockSize (vLLM's padded size varies with TP)",
    ),
    VersionRule(
        key="replicated-hetero-tp-unservable",
        first=20,
        last=20,
        upstream="measured on two H200s, bench/results/2026-11-29-gpu-issue16-replicated-block1056.json: TP 2 -> TP 1 "
        "with 1 KV head and 1 Mamba group, --block-size 1056 on both (kernel block 32): P->D NaN on 13/16 pair-check "
        "prompts; different block sizes are paired only from #49612 (0.27)",
        note="different TP sizes that replicate KV heads or Mamba groups have no working block size: vLLM's own "
        "sizes differ between the roles (equal-block-size), and an explicit one that makes them equal corrupted "
        "P->D; use equal TP sizes, TP sizes that split the heads, or vLLM 0.27+",
    ),
    VersionRule(
        key="hetero-block-size",
        first=27,
        last=_LAST,
        upstream="#49612 (0.27): heterogeneous P/D block sizes for hybrid models",
        note="prefill and decode may derive different block sizes; leave spec.blockSize unset (different kernel "
        "block sizes across TP are still a known gap, #41886)",
    ),
    VersionRule(
        key="hetero-tp-mamba2",
        first=_FIRST,
        last=_LAST,
        upstream="#37635 (0.20): heterogeneous-TP 3-read conv transfer for Mamba2",
        note="prefill and decode TP may differ when one divides the other",
    ),
    VersionRule(
        key="fa-kernel-blocks-16-32-64",
        first=20,
        last=24,
        upstream="#27264/#27753 stopgap; removed by #36701 (0.25)",
        note="FlashAttention with an fp32 Mamba cache uses 16/32/64-token kernel blocks only; an explicit --block-size "
        "(128 -> 640 on 64) gave NaN P->D output on 0.20 (bench/gpu/README.md): prefer leaving spec.blockSize unset",
    ),
    VersionRule(
        key="no-builtin-ssd-warmup",
        first=20,
        last=21,
        upstream="#39822 (0.22) added it",
        note="vLLM does not autotune the Mamba2 SSD kernels at startup: without our warmup the first request pays it",
    ),
    VersionRule(
        key="builtin-ssd-warmup",
        first=22,
        last=_LAST,
        upstream="#39822 (0.22)",
        note="vLLM autotunes the SSD kernels at startup for seqlen = chunk_size only; our warmup still covers the "
        "other length classes, initial states and decode's 1-token recompute",
    ),
    VersionRule(
        key="seqlen-specialization",
        first=20,
        last=22,
        upstream="removed by #43803 (0.23)",
        note="Triton specializes the SSD/conv kernels on seqlen (1 / multiple of 16 / other): the warmup sends "
        "prompts of each class",
    ),
    VersionRule(
        key="side-channel-host-in-compile-key",
        first=20,
        last=21,
        upstream="ai-dynamo/dynamo#10695, #46235; ignored from 0.22",
        note="VLLM_NIXL_SIDE_CHANNEL_HOST is hashed into the torch.compile cache key: a new pod IP recompiles",
        hybrid_only=False,
    ),
    VersionRule(
        key="kv-both-deprecated",
        first=23,
        last=_LAST,
        upstream="#43874 (RFC #43807)",
        note="kv_role kv_both logs a deprecation (still accepted in 0.33); the operator never emits it",
        hybrid_only=False,
    ),
    VersionRule(
        key="replaced-prefill-never-released",
        first=20,
        last=24,
        upstream="#49238 (open); no engine_ttl before 0.25",
        note="a replaced prefill's NIXL state stays on decode until decode restarts (segfault/hang seen after a "
        "prefill restart upstream; a clean SIGTERM restart on the H200 did not reproduce it): decode's runtime "
        "re-checks the pair whenever a prefill pod, IP or boot id changes, is not Ready while the check fails, and "
        "restarts its vLLM (exit 75) if the pair stays broken; the operator does not restart decode pods itself",
        hybrid_only=False,
    ),
    VersionRule(
        key="replaced-prefill-ttl",
        first=25,
        last=32,
        upstream="#49238; engine_ttl (kv_connector_extra_config, default 3600 s); #50047 open",
        note="a replaced prefill's NIXL state is evicted on decode only after engine_ttl (1 h)",
        hybrid_only=False,
    ),
    VersionRule(
        key="replaced-prefill-released",
        first=33,
        last=_LAST,
        upstream="#49238; 0.33 releases a replaced engine's state once its reads drain (#54689), pull mode only",
        note="a replaced prefill's NIXL state is released on decode after the new handshake (NixlConnector = pull)",
        hybrid_only=False,
    ),
    VersionRule(
        key="nixl-abort-timeout",
        first=20,
        last=21,
        upstream="#25897 (default 120 -> 480 s: early frees under load), #21570 (decode then reads freed blocks: "
        "wrong output), #41383 (the lease that replaces it, 0.22)",
        note="VLLM_NIXL_ABORT_REQUEST_TIMEOUT stays at its 480 s: prefill holds the KV of a request whose decode "
        "died that long, but no decode heartbeat extends it in this version, so a shorter one frees the blocks of "
        "requests still queued on a busy live decode, which then reads freed blocks (#21570); degraded mode takes "
        "the endpoint off the router 0.2 s after a decode's SIGTERM, so only the requests in flight then are "
        "orphaned (2 of 2,345 in the bench's decode restart, 0.20, roles in separate PID namespaces: "
        "bench/results/2026-12-03-gpu-degraded-restart-decode-pods.json), and a shorter timeout frees nothing on an "
        "idle prefill before its next engine step (30 s set: released after ~70 s, same file)",
        hybrid_only=False,
    ),
    VersionRule(
        key="nixl-kv-lease",
        first=22,
        last=_LAST,
        upstream="#41383 (kv_lease_duration, 30 s; decode heartbeats every lease/6 extend it while a request waits)",
        note="the KV of a request whose decode died is freed after kv_lease_duration (30 s; measured ~30 s on "
        "0.25.1: bench/results/2026-12-02-gpu-decode-restart-v025.json) while a live decode's heartbeats keep its "
        "queued requests' blocks: the default is kept",
        hybrid_only=False,
    ),
    VersionRule(
        key="multi-node-mp",
        first=_FIRST,
        last=_LAST,
        upstream="#23691 (vLLM's multiprocessing executor across nodes, 0.11: --nnodes, --node-rank, --master-addr, "
        "--master-port, --headless); #26338 (the leader serves the NIXL metadata of the ranks on other nodes, 0.12)",
        note="a replica that spans nodes runs vLLM's own multiprocessing executor on each of its pods (no Ray): the "
        "leader (--node-rank 0) serves the API and the NIXL side channel for every rank, the workers run headless "
        "ranks; KV moves straight to and from each rank's pod",
        hybrid_only=False,
        when="multi-node",
    ),
    VersionRule(
        key="nixl-no-pipeline-parallel",
        first=20,
        last=26,
        upstream="0.20 v1/engine/core.py merges each worker's {tp_rank: metadata}, so the stages overwrite one another; "
        "0.25 kv_connector/v1/base.py refuses it ('NixlConnector received pp_rank > 0 handshake metadata but does not "
        "support PP-disaggregated KV transfer', #43720, #52913); NIXL reads stages from 0.27",
        note="NIXL moves no KV from or to a pipeline-parallel replica: pipelineParallelSize must be 1 on both roles",
        hybrid_only=False,
        when="pipeline-parallel",
    ),
    VersionRule(
        key="nixl-pipeline-parallel-prefill",
        first=27,
        last=_LAST,
        upstream="NixlConnector handshakes with every stage of a pipeline-parallel producer "
        "(kv_connector/v1/nixl/base_worker.py _nixl_handshake, remote_pp_size; #43720, #45880) and refuses a "
        "pipeline-parallel consumer and hybrid KV cache layouts (HMA) under PP > 1 (NotImplementedError, same file)",
        note="a pipeline-parallel prefill of an attention-only model feeds a decode of one stage; decode and hybrid "
        "models keep pipelineParallelSize 1",
        hybrid_only=False,
        when="pipeline-parallel",
    ),
    VersionRule(
        key="hybrid-pd-fixes-complete",
        first=27,
        last=_LAST,
        upstream="#45357, #48085, #48481, #49612, #49903 all shipped by 0.27",
        note="the first line without hybrid P/D caveats (async scheduling, block sizes, zeroer warmup)",
    ),
)
"""Every rule, by range. Contiguous per topic, so any minor in c.VLLM_MINORS gets a complete answer."""


@dataclass(frozen=True)
class VersionRow:
    """What one vLLM minor needs for hybrid Mamba2 P/D over NIXL: the rules that cover it."""

    minor: str
    rules: tuple[VersionRule, ...]

    def has(self, key: str) -> bool:
        return any(r.key == key for r in self.rules)

    def rule(self, key: str) -> VersionRule:
        return next(r for r in self.rules if r.key == key)

    def cite(self, key: str) -> str:
        """`rule <key> (vLLM <range>; <upstream>)`, for injection reasons."""
        r = self.rule(key)
        return f"rule {r.key} (vLLM {r.versions}; {r.upstream})"

    @property
    def needs_no_disable_hybrid_kv_cache_manager(self) -> bool:
        return self.has("hybrid-kv-cache-manager-flag")

    @property
    def needs_no_async_scheduling(self) -> bool:
        return self.has("no-async-scheduling")

    @property
    def equal_block_size_required(self) -> bool:
        return self.has("equal-block-size")

    @property
    def kv_both_deprecated(self) -> bool:
        return self.has("kv-both-deprecated")

    @property
    def side_channel_host_in_compile_key(self) -> bool:
        return self.has("side-channel-host-in-compile-key")

    @property
    def ssd_warmup_builtin(self) -> bool:
        return self.has("builtin-ssd-warmup")


SUPPORTED_RANGE: Final = c.VLLM_RANGE_TEXT
BLOCK_SIZE_FIXED_MINOR: Final = (0, 27)
"""vLLM 0.27 carries every hybrid P/D zeroing fix (#48085, #48481, #49612); before it a raised block corrupted P->D."""


# ---------------------------------------------------------------------------------------------------------------
# The one version parser
# ---------------------------------------------------------------------------------------------------------------
_VERSION: Final = re.compile(r"v?(\d+)\.(\d+)(?:\.(\d+))?")
_PREFIX: Final = re.compile(_VERSION.pattern + r"(?![\d.])")


@dataclass(frozen=True)
class Version:
    """A release as written: `0.25.1`, `0.25`, `v0.25.1`."""

    major: int
    minor: int
    patch: int | None = None

    @property
    def series(self) -> str:
        """`0.25`: what the version table and the flag lists (vllm_flags/<series>.json) are keyed by."""
        return f"{self.major}.{self.minor}"

    def same_release(self, other: Version) -> bool:
        """The same major.minor, and the same patch where both name one."""
        same_patch = self.patch is None or other.patch is None or self.patch == other.patch
        return (self.major, self.minor) == (other.major, other.minor) and same_patch


def parse_version(text: str, *, prefix: bool = False) -> Version | None:
    """`0.25.1` -> Version(0, 25, 1); None when `text` is not a version. `prefix`: only the start must be one, not
    followed by a digit or a dot (an image tag `0.25.1-cu130`; `0.25.1.post1` is no version)."""
    m = (_PREFIX.match if prefix else _VERSION.fullmatch)(text if prefix else text.strip())
    if m is None:
        return None
    return Version(int(m.group(1)), int(m.group(2)), int(m.group(3)) if m.group(3) is not None else None)


def version_row(version: str) -> VersionRow:
    """The rules for a version (`0.25.1` -> minor 0.25); SpecError naming spec.vllmVersion outside the table."""
    v = parse_version(version)
    if v is None or v.major != 0 or v.minor not in c.VLLM_MINORS:
        raise SpecError.one(
            "spec.vllmVersion",
            "supported-vllm-version",
            f"vLLM {version!r} is outside the version table: supported are the releases from {SUPPORTED_RANGE} "
            "(e.g. 0.20.0 or 0.33.0)",
        )
    return VersionRow(minor=v.series, rules=tuple(r for r in VERSION_RULES if r.covers(v.minor)))


def kv_both_since() -> str:
    """Since when vLLM deprecates kv_role kv_both, with the upstream numbers (`0.23, #43874 (RFC #43807)`)."""
    rule = next(r for r in VERSION_RULES if r.key == "kv-both-deprecated")
    return f"0.{rule.first}, {rule.upstream}"


def image_version_warning(image: str, version: str) -> str | None:
    """A warning when the image tag names another vLLM release than spec.vllmVersion (None if it agrees or the
    tag names no version, e.g. a digest or `latest`). Compares the patch only when both give one."""
    ref = image.split("@", 1)[0]
    tag = ref.rsplit(":", 1)[1] if ":" in ref.rsplit("/", 1)[-1] else ""
    got, want = parse_version(tag, prefix=True), parse_version(version)
    if got is None or want is None or got.same_release(want):
        return None
    return (
        f"spec.image {image!r} is tagged {tag!r} but spec.vllmVersion is {version!r}: the flags follow the version "
        "table for spec.vllmVersion; set spec.vllmVersion to the image's vLLM release (or use an image of that release)"
    )
