#!/usr/bin/env python3
"""Validates structured-output answers with the `jsonschema` package (an implementation
independent of dynrt's grammar): reads a JSON list of {"schema": S, "text": T} (S null: any
JSON object) and checks that each T parses and is valid against S.

    python3 scripts/validate_json.py answers.json

Prints "N of M valid" and exits 1 naming the first answers that are not.
"""

import json
import sys

import jsonschema


def main() -> int:
    with open(sys.argv[1], encoding="utf-8") as f:
        cases = json.load(f)
    bad = []
    for i, case in enumerate(cases):
        schema = case["schema"] if case["schema"] is not None else {"type": "object"}
        try:
            jsonschema.validate(json.loads(case["text"]), schema)
        except (json.JSONDecodeError, jsonschema.ValidationError) as e:
            bad.append(f"{i}: {case['text']!r}: {str(e).splitlines()[0]}")
    print(f"{len(cases) - len(bad)} of {len(cases)} valid")
    for b in bad[:10]:
        print(b, file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
