import timeouts

@timeouts.handler("order.close")
def close_order(task):
    print("closing", task.biz_id)
