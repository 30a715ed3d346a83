"""What to send: the job file, inputs, templates, fingerprints, preflight and the request of a row."""
