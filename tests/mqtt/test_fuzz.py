"""Any payload on a say topic gets exactly one well-formed answer, and the service goes on
serving (in process; the real service on a fake connection)."""

from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.fake import BASE, FakeConnection, Services, body

RESPONSE = f"{BASE}/bridge/response/say"

payloads = st.one_of(
    st.binary(max_size=300),
    st.text(max_size=120).map(str.encode),
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(max_size=30),
        lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=6), c, max_size=3),
        max_leaves=12,
    ).map(lambda v: json.dumps(v).encode()),
    st.fixed_dictionaries(
        {"text": st.text(max_size=40)},
        optional={"id": st.text(max_size=10) | st.integers(), "voice": st.text(max_size=8)},
    ).map(lambda v: json.dumps(v).encode()),
)


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(payload=payloads)
def test_fuzzed_payloads_get_one_answer_each(services: Services, payload: bytes) -> None:
    if not services.running:
        services(default_voice="heart", scheduler={"idle_enabled": False})
    service = services.running[-1]
    conn: FakeConnection = service.bridge._connection  # type: ignore[assignment]
    since = conn.mark()
    message = conn.deliver(f"{BASE}/say/fuzz", payload)
    answer = body(conn.wait_for(lambda m: m.topic == RESPONSE, since=since, what="an answer"))
    assert answer["status"] in ("ok", "error"), answer
    if answer["status"] == "error":
        assert answer["code"] and answer["error"], answer
    assert answer["id"] not in (None, ""), answer
    assert (message.mid, 1) in conn.acks
    alive_since = conn.mark()
    conn.deliver(f"{BASE}/say/fuzz", json.dumps({"text": "Still alive.", "id": "alive"}))
    alive = body(
        conn.wait_for(
            lambda m: m.topic == RESPONSE and body(m)["id"] == "alive",
            since=alive_since,
            what="alive",
        )
    )
    assert alive["status"] == "ok"
    # Exactly one answer for the fuzzed payload (a stray second one would show up by now).
    answers = [body(m) for m in conn.on(RESPONSE, since)]
    assert len(answers) == 2, answers
