"""The process's broadcaster: what queued up while it was sending goes out as one batch, a group's
consecutive event messages merged into one `session.events`, every group's messages in order."""

from __future__ import annotations

import asyncio

from config.channel_layer import ThreadSafeInMemoryChannelLayer
from sessions_app.runtime.events import Broadcaster, merged_by_group


def event(seq: int) -> dict:
    return {"type": "session.event", "event": {"seq": seq, "type": "message.created", "data": {}}}


def events(*seqs: int) -> dict:
    return {"type": "session.events", "events": [event(seq)["event"] for seq in seqs]}


def delta(text: str) -> dict:
    return {"type": "session.delta", "event": {"seq": None, "type": "model.delta", "data": {"text": text}}}


def test_a_groups_runs_of_events_merge_and_deltas_keep_their_place():
    layer = object()
    batch = [
        (layer, "a", event(1)),
        (layer, "b", event(7)),
        (layer, "a", events(2, 3)),
        (layer, "a", delta("hel")),
        (layer, "a", event(4)),
        (layer, "a", event(5)),
        (layer, "b", {"type": "sessions.status", "event": {"seq": 8}}),
    ]

    merged = merged_by_group(batch)

    assert merged[(layer, "a")] == [events(1, 2, 3), delta("hel"), events(4, 5)]
    assert merged[(layer, "b")] == [event(7), {"type": "sessions.status", "event": {"seq": 8}}]


def test_a_burst_reaches_the_listener_complete_and_in_order():
    layer = ThreadSafeInMemoryChannelLayer(capacity=1000)
    broadcaster = Broadcaster()

    async def listen() -> list[int]:
        channel = await layer.new_channel()
        await layer.group_add("session-x", channel)
        for seq in range(1, 201):
            broadcaster.send(layer, "session-x", event(seq))
        received: list[int] = []
        while len(received) < 200:
            message = await asyncio.wait_for(layer.receive(channel), 10)
            received += [e["seq"] for e in (message.get("events") or [message["event"]])]
        return received

    assert asyncio.run(listen()) == list(range(1, 201))
