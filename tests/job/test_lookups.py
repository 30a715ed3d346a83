"""Lookup maps and leaves (job/inputs/lookups.py, job/config.py): a key with two values refused naming
both, a frozen map read back as it was, each `on_miss`, and a leaf naming an undefined lookup."""

from __future__ import annotations

import hashlib
from pathlib import Path
from unittest.mock import patch

import orjson
import pytest

from bulkrelay.errors import ConfigInvalid, InputInvalid
from bulkrelay.job.batch import BatchRenderer
from bulkrelay.job.config import JsonLookup, parse_job, required_fields
from bulkrelay.job.inputs.lookupmap import CompactMap, held
from bulkrelay.job.inputs.lookups import (
    LookupMissed,
    build_map,
    freeze,
    lookup_getter,
    map_record,
    read_frozen,
)
from bulkrelay.job.records import Record
from bulkrelay.job.request import RequestRenderer
from bulkrelay.job.template import RenderError


def _leaf(on_miss: str) -> JsonLookup:
    return JsonLookup.model_validate({"lookup": "ids", "key": {"from": "ref"}, "on_miss": on_miss})


def test_a_key_given_twice_with_two_values_is_refused_naming_both() -> None:
    assert build_map("ids", [("a", 1), ("a", 1), (7, 2)], "q") == {"a": 1, "7": 2}  # the same twice: fine
    with pytest.raises(InputInvalid, match=r"ids: key 'a' has two values, 1 and 3"):
        build_map("ids", [("a", 1), ("a", 3)], "q")


def test_a_frozen_map_reads_back_as_it_was(tmp_path: Path) -> None:
    table = {"a": {"id": 1}, "b": None, "c": "x"}
    assert freeze(tmp_path / "ids.jsonl", table) == 3
    assert (tmp_path / "ids.jsonl").stat().st_mode & 0o777 == 0o600
    assert read_frozen(tmp_path / "ids.jsonl") == table
    digest = hashlib.sha256((tmp_path / "ids.jsonl").read_bytes()).hexdigest()
    assert map_record(table) == {"sha256": digest, "entries": 3}  # what a run's plan records of it
    assert map_record(read_frozen(tmp_path / "ids.jsonl")) == map_record(table)


def test_each_on_miss() -> None:
    assert lookup_getter(_leaf("fail"), {"ids": {"7": 2}}, lambda f: f["ref"])({"ref": 7}) == 2  # 7 as text
    assert lookup_getter(_leaf("null"), {"ids": {}}, lambda f: f["ref"])({"ref": "z"}) is None
    with pytest.raises(LookupMissed):
        lookup_getter(_leaf("skip"), {"ids": {}}, lambda f: f["ref"])({"ref": "z"})
    with pytest.raises(RenderError, match="lookup ids has no key 'z'") as failed:
        lookup_getter(_leaf("fail"), {"ids": {}}, lambda f: f["ref"])({"ref": "z"})
    assert not isinstance(failed.value, LookupMissed)
    with pytest.raises(LookupMissed):  # a null key is no key: never the text `null` a map holds
        lookup_getter(_leaf("skip"), {"ids": {"null": 5}}, lambda f: f["ref"])({"ref": None})


def test_a_leaf_naming_an_undefined_lookup_is_refused() -> None:
    text = """
version: 1
lookups: { ids: { results_of: accounts, value: /captured/id } }
request:
  url: https://example.com/c
  json: { accountId: { lookup: owners, key: { from: ref } } }
"""
    with pytest.raises(ConfigInvalid, match="lookup owners, which lookups: does not define"):
        parse_job(text, file="job.yaml")
    assert parse_job(text.replace("owners", "ids"), file="job.yaml").lookups["ids"].results_of == "accounts"


def test_a_lookup_inside_a_value_leaf_reads_the_maps_and_is_checked() -> None:
    """A lookup leaf may be a `coalesce` choice or a `when` branch (job/values.py): it reads the job's maps
    there too, a `request.nulls` leaves it alone, and one naming an undefined lookup is refused there too."""
    text = """
version: 1
lookups: { ids: { results_of: accounts, value: /captured/id } }
request:
  url: https://example.com/c
  nulls: omit
  json:
    accountId: { coalesce: [ { lookup: ids, key: { from: ref }, on_miss: "null" }, { value: none } ] }
    owner: { when: { field: kind, equals: vip }, then: { lookup: ids, key: { from: boss } } }
"""
    config = parse_job(text, file="job.yaml")
    renderer = RequestRenderer.from_config(config.request, {}, lookups={"ids": {"a": 1, "b": 2}})
    body = orjson.loads(renderer.render(Record(1, 2, {"ref": "a", "kind": "vip", "boss": "b"})).body or b"")
    assert body == {"accountId": 1, "owner": 2}
    body = orjson.loads(renderer.render(Record(2, 3, {"ref": "z", "kind": "no", "boss": "b"})).body or b"")
    assert body == {"accountId": "none"}
    with pytest.raises(ConfigInvalid, match="lookup owners, which lookups: does not define"):
        parse_job(
            text.replace("lookup: ids, key: { from: boss }", "lookup: owners, key: { from: boss }"), file="j"
        )


_BATCH = """
version: 1
input: { file: c.csv, key: id }
lookups: { ids: { results_of: accounts, value: /captured/id } }
request:
  url: https://example.com/c
  batch:
    max_items: 10
    item: { id: { from: id }, accountId: { lookup: ids, key: { from: ref }, on_miss: MISS } }
"""


def test_a_lookup_leaf_in_a_batch_item_reads_the_maps() -> None:
    """A batch item's lookup leaf reads the job's maps as request.json's do; a miss fails the row (its
    field named) or sends null; `skip` is refused when the job is loaded: a batch cannot leave a row out."""
    maps = {"ids": {"a": "001A"}}
    for on_miss in ("fail", "null"):
        config = parse_job(_BATCH.replace("MISS", on_miss), file="job.yaml")
        assert required_fields(config)["ref"] == ("request", "batch", "item", "accountId", "key", "from")
        renderer = RequestRenderer.from_config(config.request, {}, lookups=maps)
        batcher = BatchRenderer.of_job(config, renderer, "f" * 64)
        assert batcher is not None
        assert orjson.loads(batcher.item(Record(1, 2, {"id": "1", "ref": "a"})).data) == {
            "id": "1",
            "accountId": "001A",
        }
        missed = Record(2, 3, {"id": "2", "ref": "z"})
        if on_miss == "null":
            assert orjson.loads(batcher.item(missed).data)["accountId"] is None
        else:
            with pytest.raises(RenderError, match="lookup ids has no key 'z'"):
                batcher.item(missed)
    with pytest.raises(
        ConfigInvalid, match=r"request.batch.item.accountId: on_miss: skip cannot leave a row"
    ):
        parse_job(_BATCH.replace("MISS", "skip"), file="job.yaml")
    with pytest.raises(
        ConfigInvalid, match=r"request.batch.item.accountId reads lookup owners, which lookups"
    ):
        parse_job(_BATCH.replace("MISS", "fail").replace("lookup: ids", "lookup: owners"), file="job.yaml")


def test_a_compact_map_reads_as_a_dict_would() -> None:
    """Every key found with its value (many keys: probes that collide), misses absent, keys in the order
    first given, a key given twice holding its first value, and a fresh value each read; a map of more
    than COMPACT_ABOVE entries is held compact, a smaller one as a dict."""
    table = {f"k{n}": {"id": n, "tags": [n]} for n in range(5000)} | {"é✓": None, "": 0}
    compact = CompactMap(table.items())
    assert len(compact) == len(table) and list(compact) == list(table)
    assert all(compact[key] == value for key, value in table.items()) and compact == table
    assert compact.get("k5000", "absent") == "absent" and "k5000" not in compact and "k1" in compact
    assert compact.get(7, "absent") == "absent"  # type: ignore[arg-type]  # keys are text, never a number
    compact["k1"]["id"] = 99
    assert compact["k1"] == {"id": 1, "tags": [1]}  # a row cannot change what the next one reads
    twice = CompactMap([("a", 1), ("b", 2), ("a", 1)])
    assert dict(twice.pairs()) == {"a": 1, "b": 2} and len(twice) == 2 and list(twice) == ["a", "b"]
    with pytest.raises(KeyError):
        compact["absent"]
    assert type(held(compact)) is dict and held(compact) == table
    with patch("bulkrelay.job.inputs.lookupmap.COMPACT_ABOVE", 100):
        assert held(compact) is compact
        assert isinstance(build_map("ids", table.items(), "q"), CompactMap)
