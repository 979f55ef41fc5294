"""router.yaml's YAML, read strictly: no duplicate keys, no alias expanding without bound, no
lone surrogate.

PyYAML resolves a duplicate key silently (the last wins), and an alias is a reference: nine
levels of nine aliases each ("billion laughs") are a small file whose data, walked as a tree
or merged with `<<`, is 9**9 nodes. An escape `"\\ud800"` makes a lone UTF-16 surrogate, which
no client can encode (review 48-e F4: one in a `^regex` source topic crashed librdkafka's
subscribe). Each is refused as one ConfigError line naming the file and the line.
"""

from __future__ import annotations

from collections.abc import Hashable
from datetime import date
from typing import Any

import yaml
from yaml.composer import ComposerError
from yaml.constructor import ConstructorError

from cdc_router.config.utf8 import LONE_SURROGATE, join_surrogate_pairs, utf8_encodable
from cdc_router.errors import ConfigError

# Nodes of the document as a tree, aliases expanded: a router.yaml of 500 routes has some
# 10,000. A merge-key bomb of 9**7 took 70 s and 800 MB to refuse (review 45 L4).
MAX_EXPANDED_NODES = 100_000


class _Refused(ConstructorError):
    """A scalar the loader refuses, with what to write instead."""

    def __init__(self, problem: str, hint: str, mark: yaml.Mark | None) -> None:
        super().__init__(None, None, problem, mark)
        self.hint = hint


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate keys, which PyYAML otherwise resolves silently,
    documents whose aliases expand beyond MAX_EXPANDED_NODES or into themselves, and text
    holding a lone surrogate."""

    def construct_scalar(self, node: yaml.ScalarNode | yaml.MappingNode) -> Any:
        value = super().construct_scalar(node)
        if isinstance(value, str) and not utf8_encodable(value):
            # JSON is YAML, and json.dumps escapes 😀 as the pair "\ud83d\ude00", which
            # PyYAML leaves as two lone surrogates: a pair is the one character JSON means.
            value = join_surrogate_pairs(value)
            if not utf8_encodable(value):
                raise _Refused(f"a text holds {LONE_SURROGATE}",
                               "write the character itself, or escape it as \\U and 8 hex "
                               "digits (\\U0001F600)", node.start_mark)
        return value

    def get_single_data(self) -> Any:
        node = self.get_single_node()
        if node is None:
            return None
        _expanded_size(node)  # before constructing: a `<<` merge copies what it expands
        return self.construct_document(node)


_MERGE_TAG = "tag:yaml.org,2002:merge"


def _mapping_without_duplicates(loader: _StrictLoader, node: yaml.MappingNode) -> Any:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        if key_node.tag == _MERGE_TAG:
            continue  # `<<: *anchor`: construct_mapping merges it; explicit keys override it
        key = loader.construct_object(key_node)
        if isinstance(key, Hashable):
            if key in seen:
                raise ConstructorError(
                    None, None, f"duplicate key {key!r}", key_node.start_mark)
            seen.add(key)
    return loader.construct_mapping(node)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG,
                              _mapping_without_duplicates)


class WrittenInt(int):
    """An integer YAML read from text that is not its plain decimal form (0123 is the octal
    83, 0x1F is 31, 1:30 is 90): the text stays with it, see written_text()."""

    text: str


class WrittenFloat(float):
    """A float YAML read from text that Python writes otherwise (1.10 is 1.1, 0.10 is 0.1)."""

    text: str


def _number(loader: _StrictLoader, node: yaml.ScalarNode) -> Any:
    value = loader.construct_yaml_int(node) if node.tag.endswith(":int") else \
        loader.construct_yaml_float(node)
    # Digit groups and a plus sign change no number's meaning, and no Kafka client takes them.
    if (str(value) if isinstance(value, int) else repr(value)) == \
            node.value.replace("_", "").removeprefix("+"):
        return value
    written = WrittenInt(value) if isinstance(value, int) else WrittenFloat(value)
    written.text = node.value
    return written


def written_text(value: object) -> str | None:
    """The text of the file that YAML read as the number `value`, when it differs from the
    number's own (0123 for 83); None otherwise. A property map takes it as written
    (review 46-2 F10: `broker.version.fallback: 0.10` went to librdkafka as 0.1)."""
    return value.text if isinstance(value, WrittenInt | WrittenFloat) else None


def yaml_kind(value: object) -> str:
    """What YAML read `value` as, in YAML's words, for an error (review 48-e F10: our class
    names showed, "is YAML's WrittenInt")."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"the boolean {str(value).lower()}"
    if isinstance(value, int | float):
        text = written_text(value)
        return f"the number {value}" + (f" (written {text})" if text else "")
    kinds = ((dict, "a mapping"), (list, "a list"), (bytes, "binary data (!!binary)"),
             (set, "a set (!!set)"), (date, "a date"))
    return next((kind for cls, kind in kinds if isinstance(value, cls)), "a value, not text")


_StrictLoader.add_constructor("tag:yaml.org,2002:int", _number)
_StrictLoader.add_constructor("tag:yaml.org,2002:float", _number)


def _expanded_size(root: yaml.Node) -> int:
    """The number of nodes of `root` as a tree (aliases expanded), counted once per node,
    so in time linear in the file; ComposerError at the first node beyond the limit, or at
    an alias inside the node it names (a loop, which gave a traceback)."""
    sizes: dict[int, int] = {}
    open_nodes: set[int] = set()

    def size(node: yaml.Node) -> int:
        known = sizes.get(id(node))
        if known is not None:
            return known
        if id(node) in open_nodes:
            raise ComposerError(None, None, "an alias refers to a node that holds it (a loop)",
                                node.start_mark)
        open_nodes.add(id(node))
        children: list[yaml.Node] = []
        if isinstance(node, yaml.SequenceNode):
            children = list(node.value)
        elif isinstance(node, yaml.MappingNode):
            children = [part for pair in node.value for part in pair]
        total = 1 + sum(size(child) for child in children)
        if total > MAX_EXPANDED_NODES:
            raise ComposerError(None, None, f"its aliases expand to over "
                                f"{MAX_EXPANDED_NODES:,} nodes (an alias bomb?); write the "
                                "repeated part out, or repeat it with fewer nested aliases",
                                node.start_mark)
        open_nodes.discard(id(node))
        sizes[id(node)] = total
        return total

    return size(root)


def parsed_yaml(text: str, source: str) -> Any:
    """The YAML document of `text`, or one ConfigError line (QA 33-b: a NUL byte gave two
    lines, 4,301 digits and deep nesting a traceback)."""
    try:
        return yaml.load(text, Loader=_StrictLoader)  # a SafeLoader subclass: no arbitrary objects
    except yaml.MarkedYAMLError as error:
        mark = error.problem_mark or error.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = error.problem or error.context or "syntax error"
        if "another document" in problem:  # PyYAML's "but found another document"
            problem = "a second document starts here (---); router.yaml is one document"
        raise ConfigError(f"{where}invalid YAML: {problem}", source=source,
                          hint=getattr(error, "hint", "fix the YAML at that line")) from None
    except yaml.reader.ReaderError as error:
        line = text[: error.position].count("\n") + 1
        found = error.character
        shown = repr(chr(found) if isinstance(found, int) else found)
        raise ConfigError(f"line {line}: invalid YAML: the character {shown} is not allowed in "
                          "YAML", source=source, hint="remove it") from None
    except yaml.YAMLError as error:
        raise ConfigError(f"invalid YAML: {' '.join(str(error).split())}", source=source
                          ) from None
    except RecursionError:
        raise ConfigError("invalid YAML: nested too deeply", source=source,
                          hint="a config nests a few levels; look for runaway brackets"
                          ) from None
    except ValueError as error:  # over Python's 4,300 digits; a date like 2026-13-45
        problem = "a number has more than 4,300 digits" if "4300" in str(error) else \
            f"a value cannot be read ({' '.join(str(error).split())})"
        raise ConfigError(f"invalid YAML: {problem}", source=source,
                          hint="quote a value meant as text") from None
