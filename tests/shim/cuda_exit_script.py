"""A script that dies outside the shim's loop, as a launched rank would run it: no goodput
import of its own (the hook comes from the launcher's PYTHONPATH). Its CUDA is
tests/shim/fake_cuda.py's FakeCudaContext (a named fake: no GPU here).

Run: python tests/shim/cuda_exit_script.py <scenario>
  import-assert   a device-side assert while the script builds its model (module level)
  loop-oom        its own training loop runs out of GPU memory
  wrapped         its own restore wraps an illegal address in an error of its own
  plain           an ordinary bug (ValueError)
  caught-exit     a CUDA fault the script catches and ends with sys.exit(3)
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.shim.fake_cuda import ILLEGAL_ADDRESS, FakeCudaContext

cuda = FakeCudaContext(memory_bytes=1 << 30)
scenario = sys.argv[1]
print(f"scenario {scenario}", flush=True)
if scenario == "import-assert":
    cuda.fail_sticky()
elif scenario == "loop-oom":
    for _step in range(3):
        cuda.allocate(2 << 30)
elif scenario == "wrapped":
    try:
        cuda.fail_sticky(ILLEGAL_ADDRESS)
    except RuntimeError as exc:
        raise RuntimeError("restore of step-40 failed") from exc
elif scenario == "plain":
    raise ValueError("a bug of the script's own")
elif scenario == "caught-exit":
    try:
        cuda.fail_sticky()
    except RuntimeError:
        sys.exit(3)
