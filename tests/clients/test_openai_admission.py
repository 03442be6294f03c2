"""Class-aware admission in front of the engine (clients/openai_server/admission.py): release in class order up to the
capacity, a share floor so the lowest class progresses under a flood, the per-class queue bound answering 429 at once,
and a waiter whose client leaves giving its place up. Order, not timing: every step is awaited explicitly."""

from __future__ import annotations

import asyncio

import pytest

from clients.openai_server.admission import ClassAdmission
from clients.openai_server.errors import OpenAIError
from clients.openai_server.traffic import TrafficClass, TrafficTable

HIGH = TrafficClass("interactive", 1.0, max_queue=3)
MID = TrafficClass("standard", 0.5)
LOW = TrafficClass("batch", 0.0, min_share=0.5)


def admission(capacity: int, *classes: TrafficClass) -> ClassAdmission:
    classes = classes or (HIGH, MID, LOW)
    return ClassAdmission(TrafficTable(classes, classes[0].name), capacity)


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def test_release_is_in_class_order_fifo_within_a_class():
    async def scenario() -> list[str]:
        gate = admission(1, HIGH, MID, TrafficClass("batch", 0.0))
        first = await gate.acquire(MID)
        order: list[str] = []

        async def wait(label: str, traffic_class: TrafficClass) -> None:
            slot = await gate.acquire(traffic_class)
            order.append(label)
            await settle()
            slot.release()

        tasks = [asyncio.ensure_future(wait(label, c)) for label, c in (("low1", gate_class(gate, "batch")), ("mid1", MID), ("high1", HIGH), ("high2", HIGH))]
        await settle()
        assert gate.depth("interactive") == 2 and gate.depth("batch") == 1
        first.release()
        await asyncio.gather(*tasks)
        return order

    assert asyncio.run(scenario()) == ["high1", "high2", "mid1", "low1"]


def gate_class(gate: ClassAdmission, name: str) -> TrafficClass:
    return gate._queues[name].traffic_class


def test_a_share_floor_lets_the_lowest_class_progress_under_a_flood():
    async def scenario() -> tuple[int, int]:
        gate = admission(4)  # batch: min_share 0.5 -> 2 of 4 slots while it waits
        running = [await gate.acquire(HIGH) for _ in range(4)]
        low = [asyncio.ensure_future(gate.acquire(LOW)) for _ in range(3)]
        high = [asyncio.ensure_future(gate.acquire(HIGH)) for _ in range(3)]
        await settle()
        for slot in running:  # four ends: the flood of high ones does not take every slot
            slot.release()
        await settle()
        served_low = sum(task.done() for task in low)
        served_high = sum(task.done() for task in high)
        for task in low + high:
            if task.done():
                task.result().release()
            else:
                task.cancel()
        await settle()
        return served_low, served_high

    assert asyncio.run(scenario()) == (2, 2)


def test_a_full_class_queue_is_a_429_at_once_and_other_classes_still_queue():
    async def scenario() -> None:
        gate = admission(1)
        slot = await gate.acquire(MID)
        waiting = [asyncio.ensure_future(gate.acquire(HIGH)) for _ in range(3)]
        await settle()
        with pytest.raises(OpenAIError) as refused:
            await gate.acquire(HIGH)
        assert refused.value.status == 429 and refused.value.headers["Retry-After"] == "1"
        assert "'interactive' has 3 requests waiting" in refused.value.message
        extra = asyncio.ensure_future(gate.acquire(MID))  # no bound of its own
        await settle()
        assert not extra.done()
        for task in waiting + [extra]:
            task.cancel()
        slot.release()
        await settle()

    asyncio.run(scenario())


def test_a_waiter_that_leaves_gives_its_place_up_and_nothing_leaks():
    async def scenario() -> None:
        gate = admission(1)
        slot = await gate.acquire(MID)
        leaving = asyncio.ensure_future(gate.acquire(HIGH))
        staying = asyncio.ensure_future(gate.acquire(LOW))
        await settle()
        leaving.cancel()
        await settle()
        assert gate.depth("interactive") == 0
        slot.release()
        await settle()
        assert staying.done() and gate.running("batch") == 1
        staying.result().release()
        staying.result().release()  # idempotent
        assert sum(gate.running(c.name) for c in (HIGH, MID, LOW)) == 0
        again = await gate.acquire(HIGH)  # free again at once
        again.release()

    asyncio.run(scenario())


def test_a_burst_of_ten_thousand_is_bounded_by_the_class_queue():
    async def scenario() -> tuple[int, int]:
        bounded = TrafficClass("interactive", 1.0, max_queue=100)
        gate = admission(2, bounded)
        slots = [await gate.acquire(bounded) for _ in range(2)]
        tasks = [asyncio.ensure_future(gate.acquire(bounded)) for _ in range(10_000)]
        await settle()
        refused = sum(1 for task in tasks if task.done() and isinstance(task.exception(), OpenAIError))
        depth = gate.depth("interactive")
        for task in tasks:
            task.cancel()
        for slot in slots:
            slot.release()
        await settle()
        return refused, depth

    assert asyncio.run(scenario()) == (9_900, 100)
