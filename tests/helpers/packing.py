"""The recorded fixtures' token packing (tests/fixtures/authors_*_toy.json, authors_window_llada.json):
token ids as one base-36 digit each (the toys' vocabularies are below 36), and reading a fixture."""

from __future__ import annotations

import json
import os

DIGITS = "0123456789abcdefghijklmnopqrstuvwxyz"
FIXTURES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fixtures")


def pack(ids) -> str:
    return "".join(DIGITS[int(i)] for i in ids)


def unpack(text: str) -> list[int]:
    return [DIGITS.index(c) for c in text]


def load_fixture(name: str) -> dict:
    with open(os.path.join(FIXTURES, name), encoding="utf-8") as f:
        return json.load(f)
