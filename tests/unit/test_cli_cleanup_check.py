"""The cleanup's start check names the config file, as the other ConfigErrors do (QA 61-a F-5:
a relay table that does not exist was said without it)."""

from __future__ import annotations

from typing import Any

import pytest

from cdc_router.cli.run import check_cleanup
from cdc_router.errors import ConfigError


class Refusing:
    def __init__(self, error: ConfigError) -> None:
        self.error = error

    def check(self) -> None:
        raise self.error


def test_a_missing_table_names_the_config_file_and_the_field() -> None:
    missing = ConfigError("the outbox table does not exist (or is not readable)",
                          field="cleanup.table", hint="create it")
    with pytest.raises(ConfigError) as refused:
        check_cleanup(Refusing(missing), "/etc/relay.yaml")  # type: ignore[arg-type]
    assert str(refused.value) == ("/etc/relay.yaml: field 'cleanup.table': the outbox table "
                                  "does not exist (or is not readable); create it")
    assert refused.value.source == "/etc/relay.yaml"


def test_an_error_naming_its_source_already_is_left_as_it_is() -> None:
    named = ConfigError("refused", source="postgres", field="cleanup.dsn")
    with pytest.raises(ConfigError) as refused:
        check_cleanup(Refusing(named), "/etc/relay.yaml")  # type: ignore[arg-type]
    assert str(refused.value) == "postgres: field 'cleanup.dsn': refused"


def test_a_passing_check_passes() -> None:
    class Passing:
        def check(self) -> Any:
            return None
    check_cleanup(Passing(), "/etc/relay.yaml")  # type: ignore[arg-type]
