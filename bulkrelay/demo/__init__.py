"""`bulkrelay demo` and the embedded loopback target it (and the tests) relay to."""
