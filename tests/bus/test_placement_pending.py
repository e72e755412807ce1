"""A cluster that has just formed may answer a replicated stream's creation with "no suitable
peers for placement" (err_code 10005) for a moment: its meta leader has not yet heard every
member's resources. A loaded machine's `goodput up --nats-cluster 3` met it once. Provisioning
must wait that out like an outage, not take it for "created meanwhile by another process" (and
then fail to find the stream, in a traceback)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import nats.js.errors
import pytest

from goodput.bus import Bus, BusSettings
from goodput.bus.client import BusUnavailableError
from goodput.bus.embedded import EmbeddedNats
from goodput.bus.store_sizing import DEFAULT_SCALE, store_limits
from goodput.bus.stores import bucket_configs, stream_configs


def _not_placed_first(
    call: Callable[..., Awaitable[Any]], times: int
) -> tuple[Callable[..., Awaitable[Any]], list[str]]:
    """``call``, answering its first ``times`` requests as a forming cluster does."""
    refused: list[str] = []

    async def refusing(config: Any, *args: Any, **kwargs: Any) -> Any:
        if len(refused) < times:
            refused.append(getattr(config, "name", None) or config.bucket)
            raise nats.js.errors.BadRequestError(
                code=400, err_code=10005, description="no suitable peers for placement"
            )
        return await call(config, *args, **kwargs)

    return refusing, refused


async def test_streams_and_buckets_are_created_once_the_cluster_can_place_them(
    nats_server: EmbeddedNats, monkeypatch: pytest.MonkeyPatch
) -> None:
    bus = await Bus.connect(BusSettings(url=nats_server.url), name="test")
    try:
        add_stream, streams_refused = _not_placed_first(bus.js.add_stream, 3)
        add_bucket, buckets_refused = _not_placed_first(bus.js.create_key_value, 2)
        monkeypatch.setattr(bus.js, "add_stream", add_stream)
        monkeypatch.setattr(bus.js, "create_key_value", add_bucket)
        await bus.provision(retry_for_s=30)
        assert len(streams_refused) == 3 and len(buckets_refused) == 2
        limits = store_limits(DEFAULT_SCALE)
        for config in stream_configs(limits):
            assert config.name is not None
            assert (await bus.js.stream_info(config.name)).config.name == config.name
        for bucket in bucket_configs(limits):
            await bus.js.key_value(bucket.bucket)
    finally:
        await bus.close()


async def test_a_cluster_that_never_places_is_one_line_after_the_wait(
    nats_server: EmbeddedNats, monkeypatch: pytest.MonkeyPatch
) -> None:
    bus = await Bus.connect(BusSettings(url=nats_server.url), name="test")
    try:
        add_stream, _ = _not_placed_first(bus.js.add_stream, 10**6)
        monkeypatch.setattr(bus.js, "add_stream", add_stream)
        with pytest.raises(BusUnavailableError) as raised:
            await bus.provision(retry_for_s=1)
        assert "no suitable peers for placement" in str(raised.value)
        assert "\n" not in str(raised.value)
    finally:
        await bus.close()
