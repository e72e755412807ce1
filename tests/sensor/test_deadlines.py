"""DeadlineQueue against a brute-force model, with random operation sequences."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from goodput.supervisor.detect.deadlines import DeadlineQueue

operations = st.lists(
    st.one_of(
        st.tuples(st.just("arm"), st.integers(0, 9), st.integers(0, 100)),
        st.tuples(st.just("disarm"), st.integers(0, 9), st.just(0)),
        st.tuples(st.just("due"), st.just(0), st.integers(0, 100)),
    ),
    max_size=60,
)


@given(operations)
def test_matches_a_brute_force_model(ops: list[tuple[str, int, int]]) -> None:
    queue: DeadlineQueue[int] = DeadlineQueue()
    model: dict[int, int] = {}
    for op, key, value in ops:
        if op == "arm":
            queue.arm(key, value)
            model[key] = min(model.get(key, value), value)
        elif op == "disarm":
            queue.disarm(key)
            model.pop(key, None)
        else:
            due = queue.due(value)
            assert sorted(due) == sorted(k for k, d in model.items() if d <= value)
            deadlines = [model.pop(k) for k in due]
            assert deadlines == sorted(deadlines)  # earliest first
        assert len(queue) == len(model)
        assert all((k in queue) == (k in model) for k in range(10))
        assert queue.next_deadline() == min(model.values(), default=None)
