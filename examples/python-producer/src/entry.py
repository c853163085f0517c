"""A Python Worker that pushes to d1queue: POST / with
{"queue", "name", "payload"}; answers what d1queue said and the job's state."""

import json

from producer import push
from workers import Response, WorkerEntrypoint

from d1queue.interfaces.client import Client


class Default(WorkerEntrypoint):
    def _client(self) -> Client:
        binding = getattr(self.env, "QUEUE", None)
        if binding is not None:
            return Client.over_binding(binding)
        return Client.over_http(str(self.env.D1QUEUE_URL), str(self.env.D1QUEUE_TOKEN))

    async def fetch(self, request):
        if request.method != "POST":
            return Response("POST a job\n", status=405)
        status, body = await push(self._client(), json.loads(await request.text()))
        return Response(
            json.dumps(body), status=status, headers={"content-type": "application/json"}
        )
