"""AMQPError: reply texts as RabbitMQ builds them, hard and soft codes, Erlang-style quoting."""

from __future__ import annotations

import pytest

from leveret.amqp import constants as c
from leveret.amqp.errors import (
    AMQPError,
    erlang_binary,
    erlang_bytes,
    erlang_tuple,
    frame_explanation,
    octets,
)


def test_reply_text_is_name_dash_explanation() -> None:
    error = AMQPError(404, "no queue 'q' in vhost '/'", 50, 10)
    assert error.reply_text == "NOT_FOUND - no queue 'q' in vhost '/'"
    assert repr(error) == "AMQPError(404, \"no queue 'q' in vhost '/'\", 50, 10)"


def test_long_reply_text_is_cut_to_252_bytes_and_an_ellipsis() -> None:
    text = AMQPError(406, "x" * 300).reply_text
    assert len(text.encode()) == 255
    assert text == ("PRECONDITION_FAILED - " + "x" * 300)[:252] + "..."
    assert AMQPError(406, "x" * 233).reply_text == "PRECONDITION_FAILED - " + "x" * 233


def test_cut_never_splits_a_character() -> None:
    text = AMQPError(406, "é" * 200).reply_text
    assert text.endswith("...")
    assert len(text.encode()) <= 255
    text.encode("utf-8").decode("utf-8")


@pytest.mark.parametrize("code", sorted(c.REPLY_NAMES))
def test_hard_and_soft(code: int) -> None:
    assert AMQPError(code, "x").hard is (code not in {311, 312, 313, 403, 404, 405, 406})


def test_for_method_stamps_only_an_unstamped_error() -> None:
    assert AMQPError(406, "x").for_method(60, 40).class_id == 60
    stamped = AMQPError(406, "x", 50, 10).for_method(60, 40)
    assert (stamped.class_id, stamped.method_id) == (50, 10)


@pytest.mark.parametrize(
    ("data", "text"),
    [
        (b"", "<<>>"),
        (b"hello", '<<"hello">>'),
        (b'a"b\\c\n\t', '<<"a\\"b\\\\c\\n\\t">>'),
        (bytes([0, 20, 0, 10]), "<<0,20,0,10>>"),
        (b"caf\xc3\xa9", "<<99,97,102,195,169>>"),
    ],
)
def test_erlang_binary(data: bytes, text: str) -> None:
    assert erlang_binary(data) == text


def test_erlang_bytes_never_quotes_text() -> None:
    assert erlang_bytes(b"ab") == "<<97,98>>"


def test_erlang_tuple_breaks_past_column_80() -> None:
    assert erlang_tuple(40, "frame_too_large", 9000, 8184) == "{frame_too_large,9000,8184}"
    assert erlang_tuple(60, "a", 1) == "{a,1}"
    assert erlang_tuple(76, "a", 1) == "{a,\n" + " " * 77 + "1}"


def test_octets_snippet() -> None:
    assert octets(b"x" * 16) == 'all octets = <<"' + "x" * 16 + '">>'
    assert octets(b"x" * 17) == 'first 16 octets = <<"' + "x" * 16 + '">>'


def test_frame_explanation() -> None:
    assert frame_explanation(8, b"") == "type 8, all octets = <<>>"
    assert frame_explanation(9, b"", "unknown_frame") == "type 9, all octets = <<>>: unknown_frame"
    assert (
        frame_explanation(1, b"", "frame_too_large", 9000, 8184)
        == "type 1, all octets = <<>>: {frame_too_large,9000,8184}"
    )
