"""Does this GPU machine offer CUDA fabric handles, the way across PID namespaces (issue #43, docs/kv-topologies.md)?

UCX's cuda_ipc crosses PID namespaces only for memory exported with a fabric handle (`CU_MEM_HANDLE_TYPE_FABRIC`):
legacy CUDA IPC handles and POSIX-fd VMM handles need the peer's pid (openucx/ucx#11978). A fabric handle needs the
device to support it, VMM memory created with that handle type, and an IMEX channel the process may open
(`/dev/nvidia-caps-imex-channels/channelN`, what an NVIDIA DRA ComputeDomain claim gives a pod). This asks the
driver, with nothing but libcuda through ctypes:

- the device attributes (VMM, POSIX-fd handles, fabric handles, the driver version);
- the IMEX channel devices and the driver's fabric-imex-mgmt capability;
- cuMemCreate of one granule with each handle type (none, POSIX fd, fabric) and the export of each handle;
- where fabric memory was created and exported: a second process in a new PID namespace (`unshare --pid`, as a
  separate pod) imports the handle, maps it and reads back the bytes the first wrote.

    python3 bench/gpu/fabric_probe.py --out fabric.json      # prints and writes the JSON
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ATTRS = {  # cuda.h CUdevice_attribute
    "virtual_memory_management_supported": 102,
    "handle_type_posix_file_descriptor_supported": 103,
    "generic_compression_supported": 115,
    "gpu_direct_rdma_with_cuda_vmm_supported": 116,
    "ipc_event_supported": 125,
    "handle_type_fabric_supported": 128,
}
HANDLE_TYPES = {"none": 0x0, "posix_fd": 0x1, "fabric": 0x8}  # CUmemAllocationHandleType
PATTERN = 0xA5


class MemLocation(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class AllocFlags(ctypes.Structure):
    _fields_ = [("compressionType", ctypes.c_ubyte), ("gpuDirectRDMACapable", ctypes.c_ubyte),
                ("usage", ctypes.c_ushort), ("reserved", ctypes.c_ubyte * 4)]  # fmt: skip


class AllocProp(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("requestedHandleTypes", ctypes.c_int), ("location", MemLocation),
                ("win32HandleMetaData", ctypes.c_void_p), ("allocFlags", AllocFlags)]  # fmt: skip


class AccessDesc(ctypes.Structure):
    _fields_ = [("location", MemLocation), ("flags", ctypes.c_int)]


class Cuda:
    def __init__(self) -> None:
        self.lib = ctypes.CDLL("libcuda.so.1")

    def err(self, rc: int) -> str:
        if rc == 0:
            return "CUDA_SUCCESS"
        s = ctypes.c_char_p()
        self.lib.cuGetErrorName(rc, ctypes.byref(s))
        return f"{(s.value or b'?').decode()} ({rc})"

    def call(self, name: str, *args: Any) -> int:
        return int(getattr(self.lib, name)(*args))

    def context(self, dev: int) -> ctypes.c_void_p:
        rc = self.call("cuInit", 0)
        if rc:
            raise RuntimeError(f"cuInit: {self.err(rc)}")
        ctx = ctypes.c_void_p()
        rc = self.call("cuDevicePrimaryCtxRetain", ctypes.byref(ctx), dev)
        if rc == 0:
            rc = self.call("cuCtxSetCurrent", ctx)
        if rc:
            raise RuntimeError(f"primary context: {self.err(rc)}")
        return ctx


def prop_for(handle_type: int, dev: int) -> AllocProp:
    p = AllocProp()
    p.type = 1  # CU_MEM_ALLOCATION_TYPE_PINNED
    p.requestedHandleTypes = handle_type
    p.location = MemLocation(1, dev)  # CU_MEM_LOCATION_TYPE_DEVICE
    return p


def map_handle(cu: Cuda, handle: int, size: int, dev: int) -> tuple[int, str]:
    """Reserve, map and enable read/write access to `handle`: (device pointer, error or '')."""
    ptr = ctypes.c_uint64()
    rc = cu.call("cuMemAddressReserve", ctypes.byref(ptr), ctypes.c_size_t(size), ctypes.c_size_t(0),
                 ctypes.c_uint64(0), ctypes.c_uint64(0))  # fmt: skip
    if rc:
        return 0, f"cuMemAddressReserve: {cu.err(rc)}"
    rc = cu.call(
        "cuMemMap", ptr, ctypes.c_size_t(size), ctypes.c_size_t(0), ctypes.c_uint64(handle), ctypes.c_uint64(0)
    )
    if rc:
        return 0, f"cuMemMap: {cu.err(rc)}"
    desc = AccessDesc(MemLocation(1, dev), 3)  # CU_MEM_LOCATION_TYPE_DEVICE, CU_MEM_ACCESS_FLAGS_PROT_READWRITE
    rc = cu.call("cuMemSetAccess", ptr, ctypes.c_size_t(size), ctypes.byref(desc), ctypes.c_size_t(1))
    if rc:
        return 0, f"cuMemSetAccess: {cu.err(rc)}"
    return int(ptr.value), ""


def try_handle_type(cu: Cuda, name: str, dev: int, fabric_out: Path | None) -> dict[str, Any]:
    ht = HANDLE_TYPES[name]
    prop = prop_for(ht, dev)
    gran = ctypes.c_size_t()
    rc = cu.call("cuMemGetAllocationGranularity", ctypes.byref(gran), ctypes.byref(prop), 0)
    out: dict[str, Any] = {"granularity": cu.err(rc) if rc else int(gran.value)}
    if rc:
        return out
    size = int(gran.value)
    h = ctypes.c_uint64()
    rc = cu.call("cuMemCreate", ctypes.byref(h), ctypes.c_size_t(size), ctypes.byref(prop), ctypes.c_uint64(0))
    out["cuMemCreate"] = cu.err(rc)
    if rc:
        return out
    if ht == HANDLE_TYPES["posix_fd"]:
        fd = ctypes.c_int(-1)
        rc = cu.call("cuMemExportToShareableHandle", ctypes.byref(fd), h, ht, ctypes.c_uint64(0))
        out["export"] = cu.err(rc)
        if rc == 0:
            os.close(fd.value)
    elif ht == HANDLE_TYPES["fabric"]:
        blob = (ctypes.c_ubyte * 64)()
        rc = cu.call("cuMemExportToShareableHandle", ctypes.byref(blob), h, ht, ctypes.c_uint64(0))
        out["export"] = cu.err(rc)
        if rc == 0 and fabric_out is not None:
            ptr, e = map_handle(cu, int(h.value), size, dev)
            out["map"] = e or "ok"
            if ptr:
                rc = cu.call("cuMemsetD8_v2", ctypes.c_uint64(ptr), ctypes.c_ubyte(PATTERN), ctypes.c_size_t(size))
                cu.call("cuCtxSynchronize")
                out["memset"] = cu.err(rc)
                fabric_out.write_bytes(bytes(blob) + size.to_bytes(8, "little"))
                out["cross_pid_namespace_import"] = importer_in_new_pid_namespace(fabric_out, dev)
                cu.call("cuMemUnmap", ctypes.c_uint64(ptr), ctypes.c_size_t(size))
                cu.call("cuMemAddressFree", ctypes.c_uint64(ptr), ctypes.c_size_t(size))
    cu.call("cuMemRelease", h)
    return out


def importer_in_new_pid_namespace(blob_file: Path, dev: int) -> dict[str, Any]:
    """A second process, in a new PID namespace (as another pod), imports the fabric handle and reads it back."""
    if shutil.which("unshare") is None or os.geteuid() != 0:
        return {"skipped": "needs root and util-linux unshare for a new PID namespace"}
    argv = ["unshare", "--pid", "--fork", "--mount-proc", "--", sys.executable, __file__, "--import", str(blob_file),
            "--device", str(dev)]  # fmt: skip
    p = subprocess.run(argv, check=False, capture_output=True, text=True, timeout=120)
    try:
        got = json.loads(p.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        got = {"stdout": p.stdout[-2000:]}
    return {"rc": p.returncode, **got, "stderr": p.stderr[-2000:]}


def import_side(blob_file: Path, dev: int) -> dict[str, Any]:
    data = blob_file.read_bytes()
    blob, size = (ctypes.c_ubyte * 64).from_buffer_copy(data[:64]), int.from_bytes(data[64:72], "little")
    cu = Cuda()
    cu.context(dev)
    out: dict[str, Any] = {"pid_in_namespace": os.getpid(), "pid_ns": os.readlink("/proc/self/ns/pid")}
    h = ctypes.c_uint64()
    rc = cu.call("cuMemImportFromShareableHandle", ctypes.byref(h), ctypes.byref(blob), HANDLE_TYPES["fabric"])
    out["import"] = cu.err(rc)
    if rc:
        return out
    ptr, e = map_handle(cu, int(h.value), size, dev)
    out["map"] = e or "ok"
    if ptr:
        host = (ctypes.c_ubyte * size)()
        rc = cu.call("cuMemcpyDtoH_v2", ctypes.byref(host), ctypes.c_uint64(ptr), ctypes.c_size_t(size))
        out["read"] = cu.err(rc)
        out["bytes_match"] = rc == 0 and all(b == PATTERN for b in bytes(host))
    return out


def imex_facts() -> dict[str, Any]:
    d = Path("/dev/nvidia-caps-imex-channels")
    facts: dict[str, Any] = {"imex_channel_devices": sorted(p.name for p in d.iterdir()) if d.is_dir() else None}
    cap = Path("/proc/driver/nvidia/capabilities/fabric-imex-mgmt")
    facts["fabric_imex_mgmt_capability"] = cap.read_text().strip() if cap.exists() else None
    facts["nvidia_imex_binary"] = shutil.which("nvidia-imex")
    if shutil.which("nvidia-smi"):
        q = subprocess.run(
            ["nvidia-smi", "-q"], check=False, capture_output=True, text=True, timeout=60
        ).stdout.splitlines()
        facts["nvidia_smi_fabric"] = [ln.strip() for i, ln in enumerate(q) if "Fabric" in ln or
                                      any("Fabric" in q[j] for j in range(max(0, i - 4), i))][:16]  # fmt: skip
        facts["nvidia_smi_driver"] = next((ln.split(":", 1)[1].strip() for ln in q if "Driver Version" in ln), None)
    return facts


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", type=int, default=0)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--import", dest="import_file", type=Path, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.import_file:
        print(json.dumps(import_side(a.import_file, a.device)))
        return 0
    cu = Cuda()
    cu.context(a.device)
    ver = ctypes.c_int()
    cu.call("cuDriverGetVersion", ctypes.byref(ver))
    name = ctypes.create_string_buffer(128)
    cu.call("cuDeviceGetName", name, 128, a.device)
    attrs = {}
    for k, v in ATTRS.items():
        val = ctypes.c_int(-1)
        rc = cu.call("cuDeviceGetAttribute", ctypes.byref(val), v, a.device)
        attrs[k] = val.value if rc == 0 else cu.err(rc)
    work = Path(os.environ.get("TMPDIR", "/tmp")) / f"fabric-probe-{os.getpid()}.bin"
    result = {
        "what": "CUDA fabric handles on this machine: device attributes, IMEX channels, cuMemCreate and export per "
                "handle type, and a fabric handle imported in a new PID namespace (bench/gpu/fabric_probe.py)",
        "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "host": {"hostname": os.uname().nodename, "kernel": os.uname().release,
                 "boot_id": Path("/proc/sys/kernel/random/boot_id").read_text().strip()},
        "device": {"index": a.device, "name": name.value.decode(), "cuda_driver_version": ver.value},
        "attributes": attrs,
        "imex": imex_facts(),
        "handle_types": {k: try_handle_type(cu, k, a.device, work if k == "fabric" else None) for k in HANDLE_TYPES},
    }  # fmt: skip
    work.unlink(missing_ok=True)
    text = json.dumps(result, indent=1)
    print(text)
    if a.out:
        a.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
