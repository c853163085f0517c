"""What the producer does, without the Workers SDK (so it runs under CPython
too): push the job a request describes, read its state back, and answer
d1queue's refusal as the API would."""

from __future__ import annotations

from typing import Any

from d1queue.interfaces.client import Client, ClientError


async def push(client: Client, request: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    """`request`: {queue, name, payload?, unique_key?}. Answers (status, body)."""
    options = {"unique_key": request["unique_key"]} if "unique_key" in request else {}
    try:
        pushed = await client.push(
            request.get("queue"), request.get("name", ""), request.get("payload"), **options
        )
        state = await client.job(pushed["id"])
    except ClientError as exc:
        return exc.status, exc.body()
    return 201, {"pushed": pushed, "state": state}
