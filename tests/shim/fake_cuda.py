"""FakeCudaContext: a NAMED FAKE of one process's CUDA context, for CPU machines (the real one
needs a GPU). It is as strict as the real thing where the shim depends on it:

* a sticky error (a device-side assert, an illegal address) poisons the context: the call that
  met it and *every later call* in this process raise the same ``torch.AcceleratorError``
  with the same ``error_code`` (the ``cudaError_t``), as torch 2.13 raises a CUDA failure —
  freeing caches, a new process group or a restore included; nothing clears it but a new
  process;
* an allocation past the memory left raises ``torch.OutOfMemoryError`` with CUDA's wording,
  and leaves the context usable.
"""

from __future__ import annotations

import torch

#: the cudaError_t values and messages of the sticky errors the fake can raise
DEVICE_ASSERT = (710, "device-side assert triggered")
ILLEGAL_ADDRESS = (700, "an illegal memory access was encountered")


class FakeCudaContext:
    def __init__(self, memory_bytes: int) -> None:
        self.memory_bytes = memory_bytes
        self.calls = 0
        self._sticky: tuple[int, str] | None = None

    @property
    def poisoned(self) -> bool:
        return self._sticky is not None

    def call(self) -> None:
        """Any CUDA call (a kernel launch, a copy, a synchronize): fails once poisoned."""
        self.calls += 1
        if self._sticky is not None:
            raise _accelerator_error(*self._sticky)

    def fail_sticky(self, error: tuple[int, str] = DEVICE_ASSERT) -> None:
        """A kernel that hits a sticky error: reported at the next synchronizing call, here."""
        self._sticky = error
        self.call()

    def allocate(self, nbytes: int) -> None:
        """One step's working memory (freed when the step ends, as the caching allocator's
        blocks return to its pool)."""
        self.call()
        if nbytes > self.memory_bytes:
            raise torch.OutOfMemoryError(
                f"CUDA out of memory. Tried to allocate {nbytes / 2**30:.2f} GiB. GPU 0 has a "
                f"total capacity of {self.memory_bytes / 2**30:.2f} GiB"
            )


def _accelerator_error(code: int, message: str) -> torch.AcceleratorError:
    error = torch.AcceleratorError(
        f"CUDA error: {message}\nCUDA kernel errors might be asynchronously reported at some "
        "other API call, so the stacktrace below might be incorrect."
    )
    error.error_code = code  # type: ignore[attr-defined]  # set by torch's C++ on a real one
    return error
