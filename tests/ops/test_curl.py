"""`render --curl`'s command line, word by word: the body is sent as it is, never read as a file name."""

from __future__ import annotations

import shlex

from bulkrelay.ops.curl import curl_command


def test_a_body_that_starts_with_an_at_sign_is_sent_as_it_is_not_read_from_a_file() -> None:
    command = curl_command("POST", "http://h/x", [], "@/proc/self/environ")
    assert shlex.split(command)[-2:] == ["--data-raw", "@/proc/self/environ"]
    assert "--data-binary" not in command


def test_a_body_with_control_characters_is_one_printable_line_piped_from_printf() -> None:
    body = "a\nb\x00c\x1b[2J\u202ed 100% \\ é"
    command = curl_command("POST", "http://h/x", [("A", "b")], body)
    assert command.isprintable() and "\u202e" not in command
    printf, curl = command.split(" | ")
    assert shlex.split(printf) == [
        "printf",
        r"a\012b\000c\033[2J\342\200\256d 100%% \\ é",
    ]
    assert shlex.split(curl) == [
        "curl",
        "--globoff",
        "-X",
        "POST",
        "http://h/x",
        "-H",
        "A: b",
        "--data-binary",
        "@-",
    ]
