"""Loader of the local lm-eval task: toy_arith.jsonl beside this file, as a one-split DatasetDict."""

import json
import os

import datasets


def load(**_metadata):
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "toy_arith.jsonl")
    with open(path, encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return datasets.DatasetDict({"test": datasets.Dataset.from_list(rows)})
