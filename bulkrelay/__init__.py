"""BulkRelay: turn a file of records into HTTP requests, durably and resumably."""

__version__ = "0.1.0"
