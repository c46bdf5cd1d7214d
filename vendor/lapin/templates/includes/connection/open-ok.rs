/// Server confirmation that the virtual host has been opened; the connection is now ready.
