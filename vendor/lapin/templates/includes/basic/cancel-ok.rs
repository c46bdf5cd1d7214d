/// Server confirmation that the consumer identified by the consumer tag has been cancelled.
