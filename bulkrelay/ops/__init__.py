"""Use cases (run, resume, retry-failed, export, inspect) returning typed results; no argparse here."""
