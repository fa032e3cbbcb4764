"""Reader and writer of orchid's logits dump format (shared by tools and tests).

A dump file is a sequence of records, nothing else (no header), little-endian:

    int32 position        position of the token fed (0-based, in the sequence)
    int32 token_id        the token fed at that position
    int32 vocab           number of logits that follow
    float32 logits[vocab] the logits computed after feeding that token
                          (i.e. the distribution of the token at position + 1)

`orchid generate --dump-logits FILE` and tools/reference_logits.py both write
one record per prompt position (teacher forced, in order) followed by one
record per decode step (each feeding the previously chosen token).
"""

import struct
from dataclasses import dataclass
from typing import BinaryIO, Iterable, Iterator, List, Union

import numpy as np

HEADER = struct.Struct("<iii")


@dataclass
class Record:
    position: int
    token: int
    logits: np.ndarray  # float32 [vocab]


def write_record(f: BinaryIO, position: int, token: int, logits) -> None:
    a = np.ascontiguousarray(np.asarray(logits, dtype="<f4").reshape(-1))
    f.write(HEADER.pack(int(position), int(token), a.shape[0]))
    f.write(a.tobytes())


def write(path, records: Iterable[Record]) -> None:
    with open(path, "wb") as f:
        for r in records:
            write_record(f, r.position, r.token, r.logits)


def iter_records(f: BinaryIO) -> Iterator[Record]:
    while True:
        head = f.read(HEADER.size)
        if not head:
            return
        if len(head) != HEADER.size:
            raise ValueError("truncated record header")
        pos, tok, vocab = HEADER.unpack(head)
        if vocab <= 0 or vocab > (1 << 26):
            raise ValueError(f"implausible vocab {vocab} at position {pos}")
        body = f.read(4 * vocab)
        if len(body) != 4 * vocab:
            raise ValueError(f"truncated logits at position {pos}")
        yield Record(pos, tok, np.frombuffer(body, dtype="<f4").astype(np.float32))


def read(path: Union[str, "os.PathLike"]) -> List[Record]:
    with open(path, "rb") as f:
        return list(iter_records(f))
