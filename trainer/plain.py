"""Checkpoint and debug-batch contents as plain data: tensors, dicts, lists, tuples, str, int, float, bool, None.

`torch.load(..., weights_only=True)` reads nothing else, so loading a checkpoint or a batch file cannot run
code. Groups, tickets and scheduler results are dataclasses in memory; these functions turn them into dicts
for saving and back after loading (the round trip is exact: resume stays bit-for-bit, tested).
"""

from __future__ import annotations

import dataclasses
from typing import Any, overload

from rollout.types import GroupResult
from trainer.episodes import Group, GroupTicket


def group_to_plain(group: Group) -> dict[str, Any]:
    return dataclasses.asdict(group)


def group_from_plain(data: dict[str, Any]) -> Group:
    return Group(**data)


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
