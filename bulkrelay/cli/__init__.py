"""The command line: parser, command table, the one renderer, the one catch site."""
