"""Checkpoint and debug-batch contents as plain data: tensors, dicts, lists, tuples, str, int, float, bool, None.

`torch.load(..., weights_only=True)` reads nothing else, so loading a checkpoint or a batch file cannot run
code. Groups, tickets and scheduler results are dataclasses in memory; these functions turn them into dicts
for saving and back after loading (the round trip is exact: resume stays bit-for-bit, tested). Groups saved
before they were ragged (checkpoint format 2 from older code, debug batch files) load too: `group_from_plain`
converts their lock-step layout.
"""

from __future__ import annotations

import dataclasses
from typing import Any, overload

from rollout.types import GroupResult
from trainer.episodes import Group, GroupTicket, Row, Turn, lockstep_rows

# Before groups were ragged a group was saved lock-step: these keys instead of `rows` (see `lockstep_rows`).
LOCKSTEP_KEYS = ("tokens", "logprobs", "token_turn", "versions", "request_ids", "engines")


def group_to_plain(group: Group) -> dict[str, Any]:
    return dataclasses.asdict(group)


def group_from_plain(data: dict[str, Any]) -> Group:
    """A saved group; one in the lock-step layout of older checkpoints and batch files becomes ragged rows."""
    if "rows" not in data:
        data = _lockstep_to_rows(data)
    rows = [Row(**{**row, "turns": [Turn(**t) for t in row["turns"]]}) for row in data["rows"]]
    return Group(**{**data, "rows": rows})


def _lockstep_to_rows(data: dict[str, Any]) -> dict[str, Any]:
    """The lock-step layout as rows. Its request ids were `<session>/t<turn>`: the session is their prefix."""
    old = {key: data[key] for key in LOCKSTEP_KEYS}
    session = old["request_ids"][0].rsplit("/t", 1)[0] if old["request_ids"] else ""
    rows = lockstep_rows(session, **old)
    rest = {k: v for k, v in data.items() if k not in LOCKSTEP_KEYS}
    return {**rest, "rows": [dataclasses.asdict(row) for row in rows]}


def groups_to_plain(groups: list[Group]) -> list[dict[str, Any]]:
    return [group_to_plain(g) for g in groups]


def groups_from_plain(data: list[dict[str, Any]]) -> list[Group]:
    return [group_from_plain(d) for d in data]


def _result_to_plain(result: GroupResult) -> dict[str, Any]:
    fields = {f.name: getattr(result, f.name) for f in dataclasses.fields(result)}
    payload = result.payload
    fields["payload"] = {"group": group_to_plain(payload)} if isinstance(payload, Group) else payload
    return fields


def _result_from_plain(data: dict[str, Any]) -> GroupResult:
    payload = data.get("payload")
    if isinstance(payload, dict) and set(payload) == {"group"}:
        payload = group_from_plain(payload["group"])
    return GroupResult(**{**data, "payload": payload})


def _ticket_to_plain(ticket: Any) -> Any:
    return {"ticket": dataclasses.asdict(ticket)} if isinstance(ticket, GroupTicket) else ticket


def _ticket_from_plain(data: Any) -> Any:
    if isinstance(data, dict) and set(data) == {"ticket"}:
        return GroupTicket(**data["ticket"])
    return data


@overload
def scheduler_state_to_plain(state: dict[str, Any]) -> dict[str, Any]: ...
@overload
def scheduler_state_to_plain(state: None) -> None: ...
def scheduler_state_to_plain(state: dict[str, Any] | None) -> dict[str, Any] | None:
    """RolloutScheduler.state_dict() with its ready (seq, GroupResult, ticket) entries as dicts."""
    if state is None:
        return None
    ready = [(seq, _result_to_plain(result), _ticket_to_plain(ticket)) for seq, result, ticket in state["ready"]]
    return {**state, "ready": ready}


@overload
def scheduler_state_from_plain(state: dict[str, Any]) -> dict[str, Any]: ...
@overload
def scheduler_state_from_plain(state: None) -> None: ...
def scheduler_state_from_plain(state: dict[str, Any] | None) -> dict[str, Any] | None:
    if state is None:
        return None
    ready = [(seq, _result_from_plain(result), _ticket_from_plain(ticket)) for seq, result, ticket in state["ready"]]
    return {**state, "ready": ready}
