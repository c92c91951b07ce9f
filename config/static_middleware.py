"""WhiteNoise that keeps Django's middleware chain async.

One sync-only middleware makes Django run the whole chain on a thread and call async views
through `async_to_sync`: a long poll (`sessions_app/api/longpoll.py`) would then block that
thread for its whole wait, and a client's disconnect could not cancel it. WhiteNoise 6 is
sync-only, so this subclass adds the async path: a static file is served on a thread, every
other request goes straight on to the async chain.
"""

from __future__ import annotations

from asgiref.sync import iscoroutinefunction, markcoroutinefunction, sync_to_async
from whitenoise.middleware import WhiteNoiseMiddleware


class AsyncWhiteNoiseMiddleware(WhiteNoiseMiddleware):
    sync_capable = True
    async_capable = True

    def __init__(self, get_response=None, settings=None):
        if settings is None:
            super().__init__(get_response)
        else:
            super().__init__(get_response, settings)
        self._async = iscoroutinefunction(get_response)
        if self._async:
            markcoroutinefunction(self)

    def __call__(self, request):
        if self._async:
            return self.__acall__(request)
        return super().__call__(request)

    async def __acall__(self, request):
        if self.autorefresh:
            static_file = await sync_to_async(self.find_file, thread_sensitive=False)(request.path_info)
        else:
            static_file = self.files.get(request.path_info)
        if static_file is not None:
            return await sync_to_async(self.serve, thread_sensitive=False)(static_file, request)
        return await self.get_response(request)
