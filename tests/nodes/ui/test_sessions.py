"""Browser sessions: random ids, bounded count, idle and token expiry."""

from hypothesis import given
from hypothesis import strategies as st

from nodes.ui.sessions import SessionStore
from tests.p2p.helpers import wait_until

FAR = 10**10  # app-node's token expiry, far away


def store(**options) -> SessionStore:
    return SessionStore(**{"idle_timeout_s": 60.0, "max_sessions": 3, **options})


def test_a_session_is_found_by_its_id_only_and_ends_on_close():
    sessions = store()
    one = sessions.open("token-1", "a@example.com", FAR, now=0.0)
    two = sessions.open("token-2", "b@example.com", FAR, now=0.0)
    assert one.id != two.id and len(one.id) >= 43
    assert sessions.get(one.id, 1.0, 1.0).token == "token-1"
    assert sessions.get(one.id[:-1], 1.0, 1.0) is None
    assert sessions.get(None, 1.0, 1.0) is None and sessions.get("", 1.0, 1.0) is None
    assert sessions.close(one.id) is one
    assert sessions.get(one.id, 1.0, 1.0) is None
    assert sessions.get(two.id, 1.0, 1.0) is two


def test_idle_sessions_end_and_use_keeps_one_alive():
    sessions = store()
    kept = sessions.open("t1", "a@x", FAR, now=0.0)
    idle = sessions.open("t2", "b@x", FAR, now=0.0)
    assert sessions.get(kept.id, 50.0, 0.0) is kept  # used at 50 s
    assert sessions.get(idle.id, 61.0, 0.0) is None  # idle 61 s
    assert sessions.get(kept.id, 100.0, 0.0) is kept  # idle 50 s only
    assert sessions.expire(now=200.0) == 1 and len(sessions) == 0


def test_a_session_ends_with_app_nodes_token():
    sessions = store()
    session = sessions.open("t", "a@x", expires_at=1000.0, now=0.0)
    assert sessions.get(session.id, 1.0, wall_now=999.0) is session
    assert sessions.get(session.id, 2.0, wall_now=1000.0) is None


def test_the_least_recently_used_session_ends_when_the_store_is_full():
    sessions = store()
    first, second, third = (sessions.open(f"t{i}", "a@x", FAR, now=0.0) for i in range(3))
    assert sessions.get(first.id, 1.0, 0.0) is first  # now second is the oldest use
    fourth = sessions.open("t4", "a@x", FAR, now=2.0)
    assert len(sessions) == 3
    assert sessions.get(second.id, 3.0, 0.0) is None
    assert all(sessions.get(s.id, 3.0, 0.0) is s for s in (first, third, fourth))


@given(st.text(max_size=200))
def test_any_cookie_value_finds_nothing_and_raises_nothing(value):
    sessions = store()
    sessions.open("t", "a@x", FAR, now=0.0)
    assert sessions.get(value, 0.0, 0.0) is None
    assert sessions.close(value) is None


async def test_the_daemon_ends_idle_sessions_on_the_clock_they_are_touched_on(nursery):
    from nodes.ui.daemon import serve_ui
    from nodes.ui.settings import UiSettings

    ui = await nursery.start(serve_ui, UiSettings(host="127.0.0.1", port=0,
                                                  api_url="http://127.0.0.1:9",
                                                  idle_timeout_s=0.2))
    ui.app.sessions.open("token", "a@example.com", FAR, ui.app.clock())
    # The sweep runs every idle_timeout_s.
    await wait_until(lambda: len(ui.app.sessions) == 0, limit_s=10)
