"""The real CUDA failures the CPU tests' FakeCudaContext (tests/shim/fake_cuda.py) stands for,
read by ``goodput.shim.step_faults.classify``: a device-side assert poisons the context (the
same error from every later call, as the fake's), an impossible allocation is an OOM that
leaves the context usable. Each runs in a process of its own: a poisoned context is never
cleared, and the kit's other tests share this one."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.gpu.kit import GPU

pytestmark = GPU

REPO = Path(__file__).resolve().parents[2]

PROBE = """
import json, torch
from goodput.shim.step_faults import classify

def raised(call):
    try:
        call()
    except Exception as exc:
        return exc
    return None

x = torch.zeros(4, device="cuda")
oom = raised(lambda: torch.empty(1 << 50, dtype=torch.uint8, device="cuda"))
usable = float((x + 1).sum().item())  # an OOM leaves the context as it was
first = raised(lambda: (x[torch.tensor([7], device="cuda")], torch.cuda.synchronize()))
later = raised(lambda: (x + 1).sum().item())
print(json.dumps({
    "oom": [type(oom).__name__, classify(oom).kind],
    "usable_after_oom": usable,
    "first": [type(first).__name__, getattr(first, "error_code", None), classify(first).kind],
    "later": [type(later).__name__, getattr(later, "error_code", None), classify(later).kind],
}))
"""


def test_a_device_side_assert_poisons_the_context_and_an_oom_does_not() -> None:
    result = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-2000:]
    seen = json.loads(result.stdout.strip().splitlines()[-1])
    assert seen["oom"] == ["OutOfMemoryError", "oom"]
    assert seen["usable_after_oom"] == 4.0
    assert seen["first"] == ["AcceleratorError", 710, "context"], seen
    assert seen["later"] == ["AcceleratorError", 710, "context"], seen
