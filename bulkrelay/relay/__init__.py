"""How to send: the engine, the sender, rate limits, retries, stop requests, progress, the transport."""
