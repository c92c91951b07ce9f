"""The project's channel layers: an in-memory one that is safe to send to from other threads
(embedded mode), and channels_redis's with a cheaper group send (production).

Embedded mode runs the Celery worker in threads beside daphne's event loop. Channels'
InMemoryChannelLayer keeps asyncio queues that belong to the receiving consumer's loop;
putting into them from a worker thread's own loop would not wake that consumer. Here a send
from a foreign loop is handed to the receiver's loop, which owns the queue.
"""

import asyncio
import logging
import time

import channels_redis.core
from channels.layers import InMemoryChannelLayer

logger = logging.getLogger(__name__)


class ThreadSafeInMemoryChannelLayer(InMemoryChannelLayer):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._receiver_loops: dict[str, asyncio.AbstractEventLoop] = {}

    async def receive(self, channel):
        self._receiver_loops[channel] = asyncio.get_running_loop()
        return await super().receive(channel)

    async def send(self, channel, message):
        owner = self._receiver_loops.get(channel)
        current = asyncio.get_running_loop()
        if owner is None or owner is current or owner.is_closed():
            return await super().send(channel, message)
        future = asyncio.run_coroutine_threadsafe(InMemoryChannelLayer.send(self, channel, message), owner)
        return await asyncio.wrap_future(future)

    def _remove_from_groups(self, channel):
        self._receiver_loops.pop(channel, None)
        return super()._remove_from_groups(channel)


class RedisChannelLayer(channels_redis.core.RedisChannelLayer):
    """channels_redis's layer with a `group_send` of one round trip per Redis connection involved.

    channels_redis sends to a group in four: expire the group's old members, read the members,
    expire each member channel's old messages, then add the message to each. Every event a
    runner commits is one group send, so on a busy worker those round trips (and redis-py's and
    asyncio's Python work around each) were a sixth of the process's CPU (issue #26). Here the
    first two are one script, which also ends the send when nobody listens (a Session nobody
    watches, the common case), and the last two are one script per connection. The semantics
    are channels_redis's: the same keys, expiry, capacity and message encoding (its own
    `_map_channel_keys_to_connection`, so process-local channels get their `__asgi_channel__`).
    """

    # KEYS: channel keys; ARGV: a message per key, a capacity per key, now, expiry.
    _DELIVER = """
        local now = tonumber(ARGV[#ARGV - 1])
        local expiry = tonumber(ARGV[#ARGV])
        local over_capacity = 0
        for i = 1, #KEYS do
            redis.call('ZREMRANGEBYSCORE', KEYS[i], 0, math.floor(now) - expiry)
            if redis.call('ZCOUNT', KEYS[i], '-inf', '+inf') < tonumber(ARGV[i + #KEYS]) then
                redis.call('ZADD', KEYS[i], now, ARGV[i])
                redis.call('EXPIRE', KEYS[i], expiry)
            else
                over_capacity = over_capacity + 1
            end
        end
        return over_capacity
    """

    # KEYS: group keys; ARGV[1] the score below which members have expired. Each group's
    # expired members are dropped and the rest returned, a list per key.
    _MEMBERS_OF_GROUPS = """
        local members = {}
        for i = 1, #KEYS do
            redis.call('ZREMRANGEBYSCORE', KEYS[i], 0, ARGV[1])
            members[i] = redis.call('ZRANGE', KEYS[i], 0, -1)
        end
        return members
    """

    async def group_send(self, group, message):
        assert self.require_valid_group_name(group), "Group name not valid"
        (members,) = await self._members_of(self.consistent_hash(group), [group])
        if members:
            await self._deliver(group, members, message)

    async def group_send_many(self, sends: list[tuple[str, list[dict]]]) -> None:
        """Each group's messages, in order: one round trip per Redis connection reads the members
        of every group (a busy worker's batch names a few hundred Sessions, nearly all of them
        watched by nobody), then only the groups someone listens to get their messages."""
        by_connection: dict[int, list[tuple[str, list[dict]]]] = {}
        for group, messages in sends:
            assert self.require_valid_group_name(group), "Group name not valid"
            by_connection.setdefault(self.consistent_hash(group), []).append((group, messages))
        for index, group_sends in by_connection.items():
            members_of = await self._members_of(index, [group for group, _ in group_sends])
            for (group, messages), members in zip(group_sends, members_of, strict=True):
                for message in messages if members else ():
                    try:
                        await self._deliver(group, members, message)
                    except Exception:  # one group's failure costs that group latency, nothing more
                        logger.warning("broadcast to %s failed", group, exc_info=True)

    async def _members_of(self, index: int, groups: list[str]) -> list[list[bytes]]:
        """The live members of each of `groups` (all on connection `index`): one round trip."""
        return await self.connection(index).eval(
            self._MEMBERS_OF_GROUPS,
            len(groups),
            *(self._group_key(group) for group in groups),
            int(time.time()) - self.group_expiry,
        )

    async def _deliver(self, group: str, members: list[bytes], message: dict) -> None:
        by_connection, message_for, capacity_of = self._map_channel_keys_to_connection(
            [member.decode("utf8") for member in members], message
        )
        for index, keys in by_connection.items():
            over_capacity = await self.connection(index).eval(
                self._DELIVER,
                len(keys),
                *keys,
                *(message_for[key] for key in keys),
                *(capacity_of[key] for key in keys),
                time.time(),
                int(self.expiry),
            )
            if over_capacity:
                logger.info("%s of %s channels over capacity in group %s", over_capacity, len(members), group)
