"""Admission in one place (`engine/admission.py`): each class's share of the queue and what a refusal says."""

from __future__ import annotations

import pytest

from streamer.engine.admission import Kind, QueueFull, Quotas, admit, check, refuse
from streamer.engine.request import Priority


def test_each_class_is_refused_at_its_share():
    q = Quotas(max_queue=10, partial_share=0.3, file_share=0.5, stream_share=0.4)
    assert [q.bound(k) for k in Kind] == [10, 3, 5, 4]
    for kind in Kind:
        assert admit(kind, q.bound(kind) - 1, q) is None
        refused = admit(kind, q.bound(kind), q)
        assert refused is not None and refused.kind is kind and refused.code == "overloaded"
    assert admit(Kind.FILE, 5, q).retry_after_s == q.retry_after_s == 1.0
    assert admit(Kind.STREAM, 4, q).retry_after_s == q.stream_retry_after_s == 5.0
    assert "file requests are refused from 5" in admit(Kind.FILE, 5, q).reason


def test_check_raises_queue_full_with_retry_after():
    q = Quotas(max_queue=4, retry_after_s=2.5)
    check(Priority.FINAL, 3, q)
    with pytest.raises(QueueFull, match="2 windows queued, partial requests are refused from 2") as e:
        check(Priority.PARTIAL, 2, q)
    assert (e.value.depth, e.value.bound, e.value.priority, e.value.retry_after_s) == (2, 2, Priority.PARTIAL, 2.5)
    assert Kind.of(Priority.FILE) is Kind.FILE


def test_gateway_refusals_have_the_same_shape():
    r = refuse("the server is shutting down; retry on another", 0.0, "shutting_down")
    assert (r.kind, r.code, r.retry_after_s) == (Kind.STREAM, "shutting_down", 0.0)


@pytest.mark.parametrize("field,value", [("max_queue", 0), ("partial_share", 0.0), ("file_share", 1.5)])
def test_bad_quotas_are_refused(field, value):
    with pytest.raises(ValueError, match=field):
        Quotas(**{field: value})
