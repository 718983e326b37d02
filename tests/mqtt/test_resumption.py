"""The order resumed entries are served in: waiting ones first, then suspects one at a time."""

from __future__ import annotations

from tts_bridge.mqtt.journal import JournalEntry
from tts_bridge.mqtt.resumption import ResumeOrder


def _entry(entry_id: int, attempts: int = 0) -> JournalEntry:
    return JournalEntry(
        entry_id, f"k{entry_id}", "tts_bridge/say", b"hi", None, None, 0.0, attempts
    )


def test_suspects_wait_for_the_waiting_ones_then_go_one_at_a_time() -> None:
    order = ResumeOrder()
    served: list[int] = []
    order.start(
        [_entry(1), _entry(2)], [_entry(3, 1), _entry(4, 1)], lambda e: served.append(e.entry_id)
    )
    assert served == [1, 2] and order.pending == 4
    order.closed(2)
    order.closed(99)  # not held: a live request
    assert served == [1, 2]
    order.closed(1)
    assert served == [1, 2, 3]  # the first suspect, alone
    order.closed(1)  # closed twice (answered, then its job ended): no second release
    assert served == [1, 2, 3]
    order.closed(3)
    assert served == [1, 2, 3, 4]
    order.closed(4)
    assert order.pending == 0


def test_without_waiting_entries_the_first_suspect_goes_at_once_and_refusals_chain() -> None:
    order = ResumeOrder()
    served: list[int] = []

    def refuse(entry: JournalEntry) -> None:  # answered on the spot (a request now invalid)
        served.append(entry.entry_id)
        order.closed(entry.entry_id)

    order.start([], [_entry(5, 2), _entry(6, 1)], refuse)
    assert served == [5, 6] and order.pending == 0


def test_a_later_resume_adds_to_the_order() -> None:
    order = ResumeOrder()
    served: list[int] = []
    order.start([_entry(1)], [_entry(2, 1)], lambda e: served.append(e.entry_id))
    order.start([_entry(7)], [], lambda e: served.append(e.entry_id))
    order.closed(1)
    assert served == [1, 7]
    order.closed(7)
    assert served == [1, 7, 2]
