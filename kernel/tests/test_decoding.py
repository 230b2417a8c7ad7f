"""``toolwire.decoding``: compressed HTTP bodies decoded under a cap, one semantics for all."""

from __future__ import annotations

import gzip
import random
import zlib
from collections.abc import Iterable

import pytest

from toolwire.decoding import (
    CODINGS,
    CorruptBody,
    Decoder,
    DecodingError,
    UnsupportedEncoding,
    content_coding,
    decoder_for,
)

BODY = b'{"jsonrpc": "2.0", "id": 7, "result": {"content": [{"type": "text", "text": "hi"}]}}'


def raw_deflate(data: bytes) -> bytes:
    c = zlib.compressobj(wbits=-zlib.MAX_WBITS)
    return c.compress(data) + c.flush()


ENCODED = {
    "gzip": gzip.compress(BODY),
    "x-gzip": gzip.compress(BODY),
    "deflate": zlib.compress(BODY),
    "raw-deflate": raw_deflate(BODY),
    "gzip-members": gzip.compress(BODY[:30]) + gzip.compress(b"") + gzip.compress(BODY[30:]),
}


def coding_of(how: str) -> str:
    return "deflate" if how == "raw-deflate" else "gzip" if how == "gzip-members" else how


def decode(coding: str, chunks: Iterable[bytes], step: int | None = None) -> bytes:
    """The whole body, fed in ``chunks``, drained ``step`` bytes at a time (None: unbounded)."""
    d = Decoder(coding)
    out = []
    for chunk in chunks:
        if step is None:
            out.append(d.decompress(chunk, None))
        else:
            out.extend(d.pieces(chunk, step))
    d.finish()
    return b"".join(out)


# -- codings


def test_content_coding_names_the_one_coding_to_undo() -> None:
    assert content_coding(None) is None
    assert content_coding("") is None
    assert content_coding(" Identity ") is None
    assert content_coding("GZIP") == "gzip"
    assert content_coding("identity, x-gzip") == "x-gzip"
    assert content_coding(" deflate ,") == "deflate"
    assert {"identity", "gzip", "x-gzip", "deflate"} == CODINGS


@pytest.mark.parametrize(
    ("header", "named"),
    [("br", "br"), ("gzip, gzip", "gzip, gzip"), ("deflate, br", "deflate, br"), ("zstd", "zstd")],
)
def test_other_or_stacked_codings_are_unsupported(header: str, named: str) -> None:
    with pytest.raises(UnsupportedEncoding) as caught:
        decoder_for(header)
    assert caught.value.coding == named
    assert str(caught.value) == (
        f"unsupported Content-Encoding {named!r}: toolwire reads identity, gzip and deflate"
    )
    assert isinstance(caught.value, DecodingError) and isinstance(caught.value, ValueError)
    with pytest.raises(UnsupportedEncoding):
        Decoder(named)


def test_identity_has_no_decoder() -> None:
    assert decoder_for(None) is None
    assert decoder_for("identity") is None
    with pytest.raises(UnsupportedEncoding):
        Decoder("identity")


@pytest.mark.parametrize("coding", ["identity", " Identity ", ""])
def test_a_decoder_for_identity_says_none_is_needed(coding: str) -> None:
    """Before: "unsupported Content-Encoding 'identity': toolwire reads identity, gzip and
    deflate", a message that contradicts itself; it now says what to do instead."""
    with pytest.raises(UnsupportedEncoding, match="needs no decoding") as caught:
        Decoder(coding)
    assert "unsupported" not in str(caught.value) and caught.value.coding == coding.strip().lower()
    with pytest.raises(UnsupportedEncoding, match="unsupported Content-Encoding 'br'"):
        Decoder("br")


# -- decoding, split anywhere


@pytest.mark.parametrize("how", list(ENCODED))
def test_a_body_split_at_every_byte_boundary_decodes_whole(how: str) -> None:
    data = ENCODED[how]
    for cut in range(len(data) + 1):
        for step in (None, 1, 7):
            got = decode(coding_of(how), [data[:cut], data[cut:]], step)
            assert got == BODY, (how, cut, step)


@pytest.mark.parametrize("how", list(ENCODED))
def test_a_body_fed_byte_by_byte_decodes_whole(how: str) -> None:
    data = ENCODED[how]
    assert decode(coding_of(how), [data[i : i + 1] for i in range(len(data))], 3) == BODY


@pytest.mark.parametrize("how", list(ENCODED))
def test_a_body_split_at_every_pair_of_boundaries_decodes_whole(how: str) -> None:
    data = ENCODED[how]
    for i in range(len(data) + 1):
        for j in range(i, len(data) + 1):
            assert decode(coding_of(how), [data[:i], data[i:j], data[j:]], 5) == BODY, (i, j)


def test_a_deflate_body_is_told_zlib_or_raw_from_its_first_two_bytes() -> None:
    # a first read of one byte is held until the second comes
    for data in (zlib.compress(BODY), raw_deflate(BODY)):
        d = Decoder("deflate")
        assert d.decompress(data[:1], 100) == b""
        assert d.decompress(data[1:], None) == BODY
        d.finish()


def test_several_gzip_members_decode_as_gzip_does() -> None:
    data = ENCODED["gzip-members"]
    assert gzip.decompress(data) == BODY
    assert decode("gzip", [data]) == BODY
    assert decode("x-gzip", [data], 4) == BODY


def test_a_body_of_no_bytes_is_empty_whatever_its_coding() -> None:
    for coding in ("gzip", "deflate"):
        d = Decoder(coding)
        assert d.decompress(b"", 10) == b""
        d.finish()


# -- the cap


def test_a_bomb_is_expanded_no_further_than_max_length() -> None:
    size = 64 * 1024 * 1024
    bomb = gzip.compress(b"\0" * size, 9)
    assert len(bomb) < 128 * 1024
    d = Decoder("gzip")
    out = d.decompress(bomb, 1001)
    assert len(out) == 1001 and d.pending and not d.eof
    # the rest is held, not expanded, until asked for
    assert len(d.decompress(b"", 5000)) == 5000


@pytest.mark.parametrize("coding", ["gzip", "deflate"])
def test_pieces_are_made_only_when_asked_for(coding: str) -> None:
    size = 8 * 1024 * 1024
    data = gzip.compress(b"a" * size) if coding == "gzip" else zlib.compress(b"a" * size)
    d = Decoder(coding)
    pieces = d.pieces(data, 4096)
    total = 0
    for piece in pieces:
        assert len(piece) <= 4096
        total += len(piece)
        if total > 100_000:
            break
    assert total <= 100_000 + 4096 and d.pending


def test_a_cap_counted_with_room_plus_one() -> None:
    """The idiom the plugins use: room left plus one; a longer result is over."""
    limit = len(BODY)
    for body, over in ((BODY, False), (BODY + b"!", True)):
        d = Decoder("gzip")
        data = gzip.compress(body)
        size, failed = 0, False
        for i in range(0, len(data), 3):
            room = limit - size
            out = d.decompress(data[i : i + 3], room + 1)
            if len(out) > room:
                failed = True
                break
            size += len(out)
        if not failed:
            d.finish()
        assert failed is over


def test_output_held_back_at_a_member_end_is_not_lost() -> None:
    first, second = gzip.compress(b"x" * 10), gzip.compress(b"y" * 10)
    d = Decoder("gzip")
    assert d.decompress(first + second, 10) == b"x" * 10
    assert d.pending
    assert d.decompress(b"", 10) == b"y" * 10
    assert d.decompress(b"", 10) == b"" and not d.pending and d.eof
    d.finish()


def test_finish_with_output_held_back_is_a_caller_error() -> None:
    d = Decoder("gzip")
    d.decompress(gzip.compress(b"x" * 100), 10)
    with pytest.raises(RuntimeError, match="drain"):
        d.finish()


def test_max_length_must_be_positive() -> None:
    # zlib reads 0 as "no bound": refused, so that a room of 0 cannot mean unbounded
    with pytest.raises(ValueError, match="at least 1"):
        Decoder("gzip").decompress(b"\x1f", 0)


# -- corrupt, truncated, trailing


@pytest.mark.parametrize("how", list(ENCODED))
def test_a_body_cut_anywhere_is_truncated(how: str) -> None:
    data = ENCODED[how]
    for cut in range(1, len(data)):
        if how == "gzip-members" and gzip_member_end(data, cut):
            continue  # whole members: a shorter, valid gzip body
        d = Decoder(coding_of(how))
        d.decompress(data[:cut], None)
        with pytest.raises(CorruptBody) as caught:
            d.finish()
        assert caught.value.coding == coding_of(how), cut


def gzip_member_end(data: bytes, cut: int) -> bool:
    try:
        gzip.decompress(data[:cut])
    except (EOFError, OSError, zlib.error):
        return False
    return True


def test_a_truncated_body_says_so() -> None:
    d = Decoder("gzip")
    d.decompress(gzip.compress(BODY)[:-4], None)
    with pytest.raises(CorruptBody, match="the gzip body ends before its compressed stream"):
        d.finish()


@pytest.mark.parametrize("how", ["gzip", "deflate", "raw-deflate"])
@pytest.mark.parametrize("garbage", [b"\0", b"\0" * 100, b"junk", b"\x1f"])
def test_bytes_after_the_end_are_corrupt(how: str, garbage: bytes) -> None:
    data = ENCODED[how]
    coding = coding_of(how)
    for cut in range(len(data) + 1):
        d = Decoder(coding)

        def feed(d: Decoder = d, cut: int = cut) -> None:
            d.decompress(data[:cut], 1000)
            d.decompress(data[cut:] + garbage, 1000)
            d.finish()  # b"\x1f": the start of a gzip member that never comes

        with pytest.raises(CorruptBody) as caught:
            feed()
        if garbage != b"\x1f" or coding != "gzip":
            assert "goes on after its compressed stream ends" in str(caught.value)


def test_trailing_bytes_arriving_later_fail_at_once() -> None:
    d = Decoder("deflate")
    assert d.decompress(zlib.compress(BODY), 1000) == BODY
    assert d.eof
    with pytest.raises(CorruptBody, match="goes on after"):
        d.decompress(b"\0" * 65536, 1000)


@pytest.mark.parametrize("coding", ["gzip", "deflate"])
def test_corrupt_data_is_corrupt_body(coding: str) -> None:
    data = bytearray(gzip.compress(BODY) if coding == "gzip" else zlib.compress(BODY))
    data[len(data) // 2] ^= 0xFF
    with pytest.raises(CorruptBody, match=f"bad {coding} body: ") as caught:
        decode(coding, [bytes(data)])
    assert caught.value.coding == coding


def test_a_label_other_than_the_data_is_corrupt() -> None:
    """gzip is gzip: zlib data labelled gzip is refused, as httpx refuses it."""
    with pytest.raises(CorruptBody):
        decode("gzip", [zlib.compress(BODY)])


def test_random_input_never_decodes_past_max_length() -> None:
    rnd = random.Random(7)
    for _ in range(300):
        data = rnd.randbytes(rnd.randrange(1, 200))
        d = Decoder(rnd.choice(["gzip", "deflate"]))
        try:
            out = d.decompress(data, 50)
            assert len(out) <= 50
            while d.pending:
                assert len(d.decompress(b"", 50)) <= 50
            d.finish()
        except DecodingError:
            pass
