"""Rows as Arrow IPC bytes (:mod:`vfray.traces.wire`), as an episode's rows travel to the sink."""

from __future__ import annotations

import pyarrow as pa

import vfray as vf
from vfray.tasksets.arithmetic import ArithmeticTaskset
from vfray.traces.convert import traces_to_table
from vfray.traces.wire import from_ipc, pack_rows, to_ipc, unpack_rows


def trace_table(n: int) -> pa.Table:
    tasks = list(ArithmeticTaskset(num_tasks=n).load())
    return traces_to_table([vf.Trace(task=t.record(), rollout_index=0) for t in tasks])


def test_a_table_comes_back_equal_schema_and_metadata_included() -> None:
    table = trace_table(3)
    back = from_ipc(to_ipc(table))
    assert back.equals(table, check_metadata=True)
    assert back.column("trace_id").to_pylist() == table.column("trace_id").to_pylist()


def test_a_slice_ships_its_own_rows_only() -> None:
    table = trace_table(40)
    one = table.slice(5, 1)
    assert len(to_ipc(one)) < len(to_ipc(table)) / 5
    assert from_ipc(to_ipc(one)).equals(one)


def test_an_episodes_rows_pack_and_unpack_as_a_pair() -> None:
    traces, empty = trace_table(2), pa.table({"x": pa.array([], pa.int64())})
    packed = pack_rows((traces, empty))
    assert all(isinstance(part, bytes) for part in packed)
    back = unpack_rows(packed)
    assert back[0].equals(traces) and back[1].equals(empty) and back[1].num_rows == 0
