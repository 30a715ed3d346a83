"""The command line: parser (it makes the typed call), the commands, the one renderer, the one catch site."""
