"""Row ids: the digest of the NUL-joined ids, the same whether or not it was cached."""

from __future__ import annotations

from hashlib import blake2b

from siglo_sql.keys import row_id


def _digest(*parts: str) -> bytes:
    return blake2b("\x00".join(parts).encode("utf-8", "surrogatepass"), digest_size=16).digest()


def test_a_cached_row_id_is_the_digest_and_only_the_last_256_are_kept() -> None:
    assert row_id.cache_info().maxsize == 256
    row_id.cache_clear()
    ids = [("", f"s{i}") for i in range(300)] + [("ns", "s0"), ("ns", "s0", "step"), ("\udcff",)]
    for parts in ids + ids:  # the second time some are cached, some were evicted
        assert row_id(*parts) == _digest(*parts)
    assert row_id.cache_info().currsize == 256
    hits = row_id.cache_info().hits
    assert row_id("\udcff") == _digest("\udcff")  # the last one asked: cached
    assert row_id.cache_info().hits == hits + 1
    assert row_id("", "s") != row_id("s")
