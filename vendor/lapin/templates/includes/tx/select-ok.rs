/// Server confirmation that transaction mode has been enabled on this channel.
