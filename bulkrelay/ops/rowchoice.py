"""Which rows a run sends, chosen in preflight's one pass: a shard's rows, a delta run's changed rows
or both, with their positions, so the relay parses just those (job/positions.py) instead of
parsing and fingerprinting every record of the input a second time.
"""

from __future__ import annotations

from dataclasses import dataclass

from bulkrelay.job.digest import RequestDigester
from bulkrelay.job.inputs import InputFingerprint, InputSpec
from bulkrelay.job.positions import RowPositions, fields_token
from bulkrelay.job.preflight import RowChooser, RowWatch
from bulkrelay.job.records import PreparedRequest, Record
from bulkrelay.ops.sharding import ShardSpec
from bulkrelay.store.rowset import RowSet
from bulkrelay.sync import DeltaStart


@dataclass(frozen=True)
class ChosenRows:
    """What preflight chose: `delta_rows` (a delta run's changed rows; None: every row, as under
    `--full` or without delta), `selection` (the rows this run sends; None: every row) and
    `positions` (the selected rows' lines and hashes; None: the relay reads the input through)."""

    delta_rows: RowSet | None = None
    selection: RowSet | None = None
    positions: RowPositions | None = None
    owned: int | None = None  # a shard's rows: how many this run is for (None: every record)


class RowChoice:
    """Fed by preflight (`chooser`), then asked what it chose (`chosen`)."""

    def __init__(self, delta: DeltaStart | None, shard: ShardSpec | None, key_field: str | None) -> None:
        self._delta = delta
        self._shard = shard
        self._key_field = key_field
        self._owned = bytearray(1)  # the shard's rows, one bit each
        self._shard_positions = RowPositions(by_request=False)  # used when there is no delta selection

    def chooser(self) -> RowChooser | None:
        """What preflight calls; None when there is nothing to choose (every row is sent)."""
        if self._shard is None and (self._delta is None or self._delta.selector is None):
            return None
        return self._observer

    def _observer(self, digester: RequestDigester | None, spec: InputSpec) -> RowWatch:
        selector = None if self._delta is None else self._delta.selector
        to_delta = None if selector is None or digester is None else selector.watch(digester, spec)
        shard, key_field, owned, positions = self._shard, self._key_field, self._owned, self._shard_positions
        if shard is None:
            assert to_delta is not None  # `chooser` gives no observer otherwise
            return to_delta
        keep_positions = selector is None or not selector.selects

        def own(record: Record) -> None:
            if shard.owns(record, key_field):
                row = record.row_number
                if row >> 3 >= len(owned):
                    owned.extend(bytes((row >> 3) + 1 - len(owned)))
                owned[row >> 3] |= 1 << (row & 7)
                if keep_positions and positions.kept:
                    positions.add(row, record.line, fields_token(record.fields))

        if to_delta is None:
            return RowWatch(lambda record, request: own(record))
        delta_observe, delta_settled = to_delta
        if delta_settled is None:

            def observe(record: Record, request: PreparedRequest) -> None:
                own(record)
                delta_observe(record, request)

            return RowWatch(observe)

        def settled(record: Record) -> bool:  # every row is the shard's to count, settled or not
            own(record)
            return delta_settled(record)

        return RowWatch(delta_observe, settled)

    def chosen(self, fingerprint: InputFingerprint) -> ChosenRows:
        """The rows among the input's records, once preflight has read them all (`fingerprint`)."""
        record_count = fingerprint.record_count
        delta_rows = None if self._delta is None else self._delta.selection(fingerprint)
        owned = None if self._shard is None else _rows(record_count, self._owned)
        if owned is None and delta_rows is None:
            return ChosenRows()
        if owned is None or delta_rows is None:
            selection = delta_rows if delta_rows is not None else owned
        else:
            selection = owned.complement().union(delta_rows.complement()).complement()
        positions = self._positions(owned, delta_rows)
        return ChosenRows(delta_rows, selection, positions, None if owned is None else len(owned))

    def _positions(self, owned: RowSet | None, delta_rows: RowSet | None) -> RowPositions | None:
        if delta_rows is None:
            positions = self._shard_positions
        else:
            assert self._delta is not None and self._delta.selector is not None
            positions = self._delta.selector.positions
            if owned is not None and positions.kept:
                positions = positions.only(owned)
        return positions if positions.kept else None


def _rows(size: int, bits: bytearray) -> RowSet:
    length = size // 8 + 1
    return RowSet.from_bytes(size, bytes(bits[:length]).ljust(length, b"\0"))
