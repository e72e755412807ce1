"""Fixtures of the actuator's tests: ``rig``, a Kubernetes backend on the API FAKE of
``kubernetes_fake`` (the local backend's tests define their own ``rig``)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from goodput_services.actuator.kubernetes_backend import KubernetesBackend
from tests.actuator.kubernetes_fake import (
    POOL,
    FakeKubernetesApi,
    Recorder,
    _backend,
    _node,
)


@pytest.fixture
async def rig() -> AsyncIterator[tuple[KubernetesBackend, FakeKubernetesApi, Recorder]]:
    api = FakeKubernetesApi(
        [
            _node("gpu-c", POOL),
            _node("gpu-a", POOL),
            _node("gpu-b", POOL),
            _node("gpu-d", POOL, ready=False),
            _node("gpu-e", POOL, cordoned=True),
            _node("cpu-a", {"goodput.dev/pool": "cpu"}),
        ]
    )
    recorder = Recorder()
    backend = _backend(api, recorder)
    yield backend, api, recorder
    await backend.shutdown()
