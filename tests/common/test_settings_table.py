"""Both settings tables keep each setting's bounds in its row: one check refuses a value
outside them naming the variable, and the docs generated from the rows show them."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from vast_manager.agent import config as agent_config
from vast_manager.common import settings_table
from vast_manager.coordinator import settings as coord_settings

from support.paths import REPO_ROOT

ROOT = REPO_ROOT


class Row(NamedTuple):
    env: str = "VM_X"
    default: Any = None
    help: str = "a setting"
    at_least: float | None = None
    above: float | None = None
    at_most: float | None = None
    below: float | None = None
    choices: tuple[str, ...] | None = None


@pytest.mark.parametrize(
    ("row", "words"),
    [
        (Row(), ""),
        (Row(at_least=1), "at least 1"),
        (Row(above=0), "greater than 0"),
        (Row(at_most=2.5), "at most 2.5"),
        (Row(below=1), "less than 1"),
        (Row(at_least=0, at_most=1000), "between 0 and 1000"),
        (Row(above=0.5, below=1.0), "greater than 0.5 and less than 1"),
        (Row(above=0, at_most=1), "greater than 0 and at most 1"),
        (Row(choices=("text", "json")), "one of text, json"),
    ],
)
def test_bounds_in_words(row: Row, words: str) -> None:
    assert settings_table.describe(row) == words


def test_the_check_refuses_outside_the_bounds_in_one_sentence() -> None:
    row = Row(above=0.5, below=1)
    settings_table.check(row, 0.75)
    for bad in (0.5, 1.0, -3, math.inf):
        with pytest.raises(ValueError) as info:
            settings_table.check(row, bad)
        assert str(info.value) == f"VM_X must be greater than 0.5 and less than 1, got {bad!r}"
    with pytest.raises(ValueError, match=r"^VM_X must be a number, got nan$"):
        settings_table.check(Row(), math.nan)  # NaN passes no comparison: refused outright
    with pytest.raises(ValueError, match=r"^VM_X must be one of a, b, got 'c'$"):
        settings_table.check(Row(choices=("a", "b")), "c")
    settings_table.check(Row(at_least=1), "text")  # bounds are for numbers and choices
    settings_table.check(Row(at_least=1), True)

    class Mine(ValueError):
        pass

    with pytest.raises(Mine):
        settings_table.check(Row(at_least=1), 0, Mine)


def edges(row: Any) -> tuple[list[Any], list[Any]]:
    """Values just inside and just outside ``row``'s bounds."""
    if row.choices is not None:
        return list(row.choices), ["no-such-choice"]
    inside: list[Any] = []
    outside: list[Any] = []
    integer = getattr(row, "kind", None) is int or isinstance(row.default, int) or row.env in (
        "VM_C1_MINER_ID", "VM_BENCH_PROOFS", "VM_BENCH_CONCURRENCY", "VM_SPOOL_MAX_BYTES"
    )
    step = 1 if integer else 0.001
    if row.at_least is not None:
        inside.append(row.at_least)
        outside.append(row.at_least - step)
    if row.above is not None:
        inside.append(row.above + step)
        outside.append(row.above)
    if row.at_most is not None:
        inside.append(row.at_most)
        outside.append(row.at_most + step)
    if row.below is not None:
        inside.append(row.below - step)
        outside.append(row.below)
    return inside, outside


def bounded(rows: tuple[Any, ...]) -> list[Any]:
    return [r for r in rows if settings_table.describe(r)]


#: Settings that go in pairs: each is tried at its edges with its partner set.
PARTNERS = {"VM_PROOF_PRICE_FIL": {"VM_FIL_USD": "3.5"},
            "VM_FIL_USD": {"VM_PROOF_PRICE_FIL": "0.005"}}


@pytest.mark.parametrize("row", bounded(coord_settings.SETTINGS), ids=lambda r: r.env)
def test_every_coordinator_bound_holds_at_its_edges(row: Any, tmp_path: Path) -> None:
    env = {"VM_FLEET_SECRET": "11" * 32, "VM_ADMIN_TOKEN": "admin-token-0123456789",
           **PARTNERS.get(row.env, {})}
    inside, outside = edges(row)
    for value in inside:
        coord_settings.Settings.from_env({**env, row.env: str(value)}, config_dir=str(tmp_path))
    for value in outside:
        with pytest.raises(ValueError) as info:
            coord_settings.Settings.from_env(
                {**env, row.env: str(value)}, config_dir=str(tmp_path)
            )
        assert str(info.value).startswith(f"{row.env} must be {settings_table.describe(row)}")
    if row.default is not None:
        settings_table.check(row, row.default)  # no default outside its own bounds


AGENT_ENV = {
    "VM_COORDINATOR_URL": "http://127.0.0.1:1",
    "VM_AGENT_ID": "ag_" + "0" * 20,
    "VM_AGENT_KEY": "ab" * 32,
}


@pytest.mark.parametrize("row", bounded(agent_config.SETTINGS), ids=lambda r: r.env)
def test_every_agent_bound_holds_at_its_edges(row: Any) -> None:
    inside, outside = edges(row)
    env = dict(AGENT_ENV)
    if row.env == "VM_PROVIDER":
        env["CONTAINER_ID"] = "1"  # `vast` needs it
    for value in inside:
        agent_config.load_config({**env, row.env: str(value)})
    for value in outside:
        with pytest.raises(agent_config.ConfigError) as info:
            agent_config.load_config({**env, row.env: str(value)})
        assert str(info.value).startswith(f"{row.env} must be {settings_table.describe(row)}")
    if row.default is not None and row.default != "auto":
        parsed = float(row.default) if row.choices is None else row.default
        settings_table.check(row, parsed)


def test_the_agent_log_level_is_read_in_any_case() -> None:
    assert agent_config.load_config({**AGENT_ENV, "VM_LOG_LEVEL": "debug"}).log_level == "DEBUG"


def test_architecture_md_shows_the_agent_table_with_its_bounds() -> None:
    doc = (ROOT / "docs" / "architecture.md").read_text()
    begin, end = "<!-- agent-settings:begin -->\n", "\n<!-- agent-settings:end -->"
    table = doc[doc.index(begin) + len(begin) : doc.index(end)]
    assert table == agent_config.settings_markdown(), (
        "docs/architecture.md's agent settings table is stale: python -m vast_manager.docs"
    )
    assert "| `VM_SAMPLE_INTERVAL` | `1.0` | greater than 0 |" in table


def test_the_agents_help_shows_the_bounds() -> None:
    text = agent_config.settings_help()
    assert "VM_BENCH_PROOFS: `-c/--count` of the benchmark (at least 1) [default: 12]" in text
    assert "(one of DEBUG, INFO, WARNING, ERROR)" in text


def test_operations_md_shows_the_coordinator_bounds() -> None:
    doc = (ROOT / "docs" / "operations.md").read_text()
    assert "| `VM_PORT` | `8420` | between 0 and 65535 |" in doc
    assert "| `VM_LOG_FORMAT` | `text` | one of text, json |" in doc
