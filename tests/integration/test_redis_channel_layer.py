"""The production channel layer's group send (config.channel_layer.RedisChannelLayer), against the
real Redis: the same deliveries as channels_redis's own — to plain and process-local channels,
none to a member whose membership expired, none beyond a channel's capacity — in fewer round
trips, and none at all to a group nobody listens on."""

from __future__ import annotations

import asyncio
import os
import uuid

import pytest
from channels_redis.core import RedisChannelLayer as StockLayer

from config.channel_layer import RedisChannelLayer

pytestmark = pytest.mark.services


@pytest.fixture
async def layers():
    prefix = f"test-layer-{uuid.uuid4().hex[:8]}"
    config = {"hosts": [os.environ["REDIS_URL"]], "prefix": prefix, "capacity": 3}
    ours, stock = RedisChannelLayer(**config), StockLayer(**config)
    yield ours, stock
    await ours.flush()
    await ours.close_pools()
    await stock.close_pools()


class CountingRoundTrips:
    """Counts the commands the layer sends to Redis while the block runs."""

    def __init__(self, layer):
        self.layer, self.count = layer, 0

    def __enter__(self):
        connection = self.layer.connection(0)
        original = connection.execute_command

        async def counted(*args, **kwargs):
            self.count += 1
            return await original(*args, **kwargs)

        connection.execute_command = counted
        self._restore = lambda: setattr(connection, "execute_command", original)
        return self

    def __exit__(self, *exc):
        self._restore()


async def test_plain_and_process_local_members_each_get_the_message_once(layers):
    ours, stock = layers
    plain = "plain-channel"
    local = await stock.new_channel()  # "specific.<id>!<id>": one Redis key per process
    for channel in (plain, local):
        await stock.group_add("watchers", channel)

    with CountingRoundTrips(ours) as trips:
        await ours.group_send("watchers", {"type": "session.event", "event": {"seq": 1}})

    assert trips.count == 2  # members, then one delivery script (channels_redis: four)
    assert (await stock.receive(plain))["event"] == {"seq": 1}
    assert (await stock.receive(local))["event"] == {"seq": 1}
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(stock.receive(plain), 0.3)


async def test_a_group_nobody_listens_on_costs_one_round_trip(layers):
    ours, _ = layers
    with CountingRoundTrips(ours) as trips:
        await ours.group_send("nobody-here", {"type": "session.event", "event": {"seq": 1}})
    assert trips.count == 1


async def test_an_expired_member_gets_nothing_and_leaves_the_group(layers):
    ours, stock = layers
    await stock.group_add("watchers", "gone-channel")
    await stock.group_add("watchers", "here-channel")
    connection = stock.connection(stock.consistent_hash("watchers"))
    await connection.zadd(stock._group_key("watchers"), {"gone-channel": 1})  # joined in 1970

    await ours.group_send("watchers", {"type": "session.event", "event": {"seq": 2}})

    assert (await stock.receive("here-channel"))["event"] == {"seq": 2}
    members = await connection.zrange(stock._group_key("watchers"), 0, -1)
    assert members == [b"here-channel"]


async def test_a_full_channel_drops_what_is_beyond_its_capacity(layers):
    ours, stock = layers
    await stock.group_add("watchers", "slow-reader")
    for seq in range(1, 6):
        await ours.group_send("watchers", {"type": "session.event", "event": {"seq": seq}})

    received = [(await stock.receive("slow-reader"))["event"]["seq"] for _ in range(3)]
    assert received == [1, 2, 3]
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(stock.receive("slow-reader"), 0.3)


async def test_many_groups_cost_one_round_trip_for_their_members_and_one_per_delivery(layers):
    ours, stock = layers
    await stock.group_add("watched", "reader")
    await stock.group_add("also-watched", "reader")
    sends = [
        (
            "watched",
            [{"type": "session.event", "event": {"seq": 1}}, {"type": "session.event", "event": {"seq": 2}}],
        ),
        *((f"unwatched-{i}", [{"type": "session.event", "event": {"seq": i}}]) for i in range(100)),
        ("also-watched", [{"type": "session.event", "event": {"seq": 7}}]),
    ]

    with CountingRoundTrips(ours) as trips:
        await ours.group_send_many(sends)

    assert trips.count == 1 + 3  # every group's members at once, then the three watched messages
    received = [(await stock.receive("reader"))["event"]["seq"] for _ in range(3)]
    assert received == [1, 2, 7]  # in order within a group, the groups in the order sent
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(stock.receive("reader"), 0.3)


async def test_many_groups_skip_expired_members_and_keep_capacity(layers):
    ours, stock = layers
    await stock.group_add("watchers", "gone-channel")
    await stock.group_add("watchers", "slow-reader")
    connection = stock.connection(stock.consistent_hash("watchers"))
    await connection.zadd(stock._group_key("watchers"), {"gone-channel": 1})  # joined in 1970

    await ours.group_send_many(
        [("watchers", [{"type": "session.event", "event": {"seq": seq}} for seq in range(1, 6)])]
    )

    assert [(await stock.receive("slow-reader"))["event"]["seq"] for _ in range(3)] == [1, 2, 3]
    assert await connection.zrange(stock._group_key("watchers"), 0, -1) == [b"slow-reader"]
