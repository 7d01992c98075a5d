"""Valid `sample` events (trainer/sample_schema.py) for the API, browser tests and bench/samples.py."""

from __future__ import annotations

from typing import Any


def sample_data(
    *,
    step: int,
    group: int = 0,
    index: int = 0,
    reward: float = 0.5,
    advantage: float = 0.0,
    finish_reason: str = "stop",
    staleness: int = 0,
    engine: str = "engine-0",
    prompt: str = "^010203>",
    completion: str = "0405",
    prompt_index: int = 0,
    pick: str = "sampled",
) -> dict[str, Any]:
    version_max = max(0, step - 1)
    version_min = max(0, step - 1 - staleness)
    half = max(1, len(completion) // 2)
    return {
        "step": step,
        "group": group,
        "index": index,
        "prompt_index": prompt_index,
        "session": f"worker-0:g{group}:a0",
        "engine": engine,
        "finish_reason": finish_reason,
        "pick": pick,
        "prompt": prompt,
        "completion": completion,
        "turns": [
            {"role": "policy", "text": completion[:half], "version": version_min, "engine": engine, "request": "r/t0"},
            {"role": "tool", "text": "06>"},
            {"role": "policy", "text": completion[half:], "version": version_max, "engine": engine, "request": "r/t1"},
        ],
        "reward": reward,
        "reward_parts": {"turn_1": 1.0 if reward > 0 else 0.0, "turn_2": 0.0},
        "advantage": advantage,
        "version_min": version_min,
        "version_max": version_max,
        "staleness": staleness,
        "length": len(completion),
    }


def sample_event(seq: int, **fields: Any) -> dict[str, Any]:
    return {"seq": seq, "type": "sample", "data": sample_data(**fields)}
