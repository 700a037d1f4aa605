"""The acknowledgement of a message of calls (durable/unpacking.py): once, when every call it
carries has been acknowledged or rejected."""

from timeouts.durable.unpacking import CarriedMessage, _Acks


def carried(n):
    done = []
    acks = _Acks(lambda log, errors: done.append("ack"), lambda log, errors, requeue: done.append(("reject", requeue)),
                 n)
    return done, [CarriedMessage({"id": str(i)}, {}, [[], {}, {}], {}, acks) for i in range(n)]


def test_the_message_is_acknowledged_once_after_its_last_call():
    done, messages = carried(3)
    messages[0].ack_log_error(None, ())
    messages[2].reject_log_error(None, (), requeue=False)
    assert done == []
    messages[1].ack_log_error(None, ())
    assert done == ["ack"]


def test_a_call_rejected_to_be_requeued_requeues_the_message_once_the_others_are_dealt_with():
    done, messages = carried(2)
    messages[0].reject_log_error(None, (), requeue=True)
    assert done == []
    messages[1].ack_log_error(None, ())
    assert done == [("reject", True)]
