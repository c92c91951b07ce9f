"""In-memory channel layer that is safe to send to from other threads.

Embedded mode runs the Celery worker in threads beside daphne's event loop. Channels'
InMemoryChannelLayer keeps asyncio queues that belong to the receiving consumer's loop;
putting into them from a worker thread's own loop would not wake that consumer. Here a send
from a foreign loop is handed to the receiver's loop, which owns the queue.
"""

import asyncio

from channels.layers import InMemoryChannelLayer


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
