"""The router's configuration: router.yaml and its CDC_ROUTER__ overrides, validated and compiled.

    load.py         load_config(): YAML + environment overrides, or one ConfigError
    overrides.py    the CDC_ROUTER__ overrides load_config applies
    compiled.py     compile_config(): routes compiled once (matchers, templates, keys, serializers)
    model.py        RouterConfig, the whole file; TopicSpec
    connections.py  kafka and schema_registry
    source.py       source, and the outbox table's columns
    routes.py       routes: match, topic template, key, format, headers
    delivery.py     delivery, dead_letter, dedup
    cleanup.py      cleanup
    status.py       status: where `cdc-router status` looks, and its thresholds
    fields.py       the base model and the field types the sections share
    topic_names.py  the naming rules: Kafka's topic names, topic templates, TopicGuard
    patterns.py     the pattern language: exact, glob or re:regex
    headers.py      the headers the router writes itself, which nobody else may
    utf8.py         what UTF-8 can encode: no lone surrogate
    json_bounds.py  what JSON every consumer reads: nesting depth, integers beyond a double
    dsn.py          what libpq refuses of a Postgres connection string, before asking a server

The rules (topic_names, patterns, headers, utf8, json_bounds, dsn) are pure leaves: they import
nothing of the router, routing or serde, so every part can use them. This file imports nothing,
so that importing any one module of the package never loads the others.
"""
