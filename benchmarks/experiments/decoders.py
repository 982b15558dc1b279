"""Measured the µs to decode the benchmark's checkpoint by orjson, ormsgpack, Checkpoint.from_json.

``python -m benchmarks.experiments.decoders [SIZE [ROUNDS [NUMBER]]]``: the wire document
every subject stores (``benchmarks.payloads``, SIZE ``1k``, ``16k`` or ``256k``, default
``256k``) encoded once as JSON (orjson, what siglo stores) and once as msgpack
(ormsgpack, what LangGraph's savers store), then decoded NUMBER times (default 200) by
``orjson.loads``, ``ormsgpack.unpackb`` and siglo's ``Checkpoint.from_json`` in turn,
ROUNDS times (default 7). Prints each decoder's µs a decode as median (min–max) of the
rounds. ormsgpack comes with LangGraph's savers (the ``bench`` extra).
"""

from __future__ import annotations

import statistics
import sys
import timeit
from collections.abc import Callable

import orjson

from benchmarks.payloads import SIZES, make_contexts, wire_document
from siglo import Checkpoint


def main(size: str, rounds: int, number: int) -> None:
    import ormsgpack  # the bench extra's (LangGraph's serializer uses it)

    doc = wire_document("decoders", 1, make_contexts(SIZES[size]), expires_at=None)
    as_json = orjson.dumps(doc)
    as_msgpack = ormsgpack.packb(doc)
    decoders: dict[str, Callable[[], object]] = {
        "orjson.loads": lambda: orjson.loads(as_json),
        "ormsgpack.unpackb": lambda: ormsgpack.unpackb(as_msgpack),
        "Checkpoint.from_json": lambda: Checkpoint.from_json(as_json),
    }
    timings: dict[str, list[float]] = {name: [] for name in decoders}
    for _ in range(rounds):
        for name, decode in decoders.items():  # interleaved: each round times all three
            timings[name].append(timeit.timeit(decode, number=number) / number * 1e6)
    print(f"{size}: {len(as_json):,} bytes as JSON, {len(as_msgpack):,} as msgpack")
    for name, us in timings.items():
        print(
            f"{size}: {name} {statistics.median(us):,.0f} us "
            f"({min(us):,.0f}-{max(us):,.0f}), {rounds} rounds of {number}"
        )


if __name__ == "__main__":
    argv = sys.argv[1:]
    main(
        argv[0] if argv else "256k",
        int(argv[1]) if len(argv) > 1 else 7,
        int(argv[2]) if len(argv) > 2 else 200,
    )
