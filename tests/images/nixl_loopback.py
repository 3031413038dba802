"""Run inside the vLLM image: two NIXL agents in one process move bytes host memory -> host memory over UCX.

No GPU: this proves the installed NIXL (native agent, UCX plugin) works in the image, not GPU (VRAM) transfers.
Prints one JSON line.
"""

import json
import time

import nixl._api as nixl
import numpy as np

config = nixl.nixl_agent_config(backends=["UCX"])
target = nixl.nixl_agent("target", config)
initiator = nixl.nixl_agent("initiator", config)
src = np.arange(1 << 16, dtype=np.uint32).view(np.uint8)
dst = np.zeros_like(src)
target.register_memory([(dst.ctypes.data, dst.nbytes, 0, "")], "DRAM")
initiator.register_memory([(src.ctypes.data, src.nbytes, 0, "")], "DRAM")
remote = initiator.add_remote_agent(target.get_agent_metadata())
local_descs = initiator.get_xfer_descs([(src.ctypes.data, src.nbytes, 0)], "DRAM")
remote_descs = target.get_xfer_descs([(dst.ctypes.data, dst.nbytes, 0)], "DRAM")
handle = initiator.initialize_xfer("WRITE", local_descs, remote_descs, remote, b"done")
state = initiator.transfer(handle)
deadline = time.monotonic() + 60
while state not in ("DONE", "ERR") and time.monotonic() < deadline:
    state = initiator.check_xfer_state(handle)
print(
    json.dumps(
        {
            "state": state,
            "bytes": int(src.nbytes),
            "equal": bool((src == dst).all()),
            "backend": initiator.query_xfer_backend(handle),
        }
    )
)
