import timeouts

CLOSED = []


@timeouts.handler("order.close", max_attempts=3, ttr=30)
def close_order(task):
    CLOSED.append((task.biz_id, task.attribute))
