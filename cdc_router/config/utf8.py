"""What UTF-8 can encode: every text but one holding a lone UTF-16 surrogate.

Python keeps a byte that is not UTF-8 (in argv, in the environment) as a lone surrogate, and
a JSON or YAML escape `\\ud800` makes one; every encode (librdkafka's, psycopg's, Avro's)
refuses it later. A leaf: config, serde, the router and the CLI check texts with it.
"""

from __future__ import annotations

# What a text with a lone surrogate holds, for reasons: "... holds " + LONE_SURROGATE.
LONE_SURROGATE = ("a lone UTF-16 surrogate (\\uD800-\\uDFFF without its pair), which UTF-8 "
                  "cannot encode")


def utf8_encodable(text: str) -> bool:
    """False when `text` holds a lone surrogate, the one thing UTF-8 cannot encode."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def join_surrogate_pairs(text: str) -> str:
    """`text` with each surrogate pair held as two code points (json.dumps's escape of 😀,
    "\\ud83d\\ude00", read by a parser that leaves them apart) joined into its character;
    a lone surrogate stays, for utf8_encodable to find."""
    return text.encode("utf-16", "surrogatepass").decode("utf-16", "surrogatepass")
