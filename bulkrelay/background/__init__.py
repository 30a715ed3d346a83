"""Work that outlives the call: the call budget, background jobs on disk, the detached worker."""
