/// Server acknowledgement of a `basic.qos` request.
