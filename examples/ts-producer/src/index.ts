// A producer Worker: pushes a job to d1queue through its service binding
// and answers what d1queue said, with the job's state.
//
//   POST /   {"queue": "mail", "name": "example.echo", "payload": {...}}
//
// The binding's type comes from @d1queue/types (clients/ts): a wrong call
// fails `tsc` (see wrong.ts), not the first request in production.

import type { D1Queue, Job, JobState, Pushed } from "@d1queue/types";

/** The job names this producer pushes: narrower than any string. */
export type JobName = "example.echo" | "example.add" | "example.ping" | "http.request";

export interface Env {
  QUEUE: Service<D1Queue<JobName>>;
}

export interface PushRequest {
  queue: string;
  name: JobName;
  payload?: Job["payload"];
  unique_key?: string;
}

export interface PushAnswer {
  pushed: Pushed;
  state: JobState;
}

export async function push(env: Env, request: PushRequest): Promise<PushAnswer> {
  const job: Job<JobName> = { name: request.name, payload: request.payload ?? null };
  if (request.unique_key !== undefined) job.unique_key = request.unique_key;
  const pushed = await env.QUEUE.dispatch(request.queue, job);
  const state = await env.QUEUE.job(pushed.id);
  return { pushed, state };
}

export default {
  async fetch(request: Request, env: Env): Promise<Response> {
    if (request.method !== "POST") return new Response("POST a job\n", { status: 405 });
    const body = (await request.json()) as PushRequest;
    try {
      return Response.json(await push(env, body), { status: 201 });
    } catch (error) {
      // d1queue refused the job: its message is "<code>: <message>".
      const message = error instanceof Error ? error.message : String(error);
      return Response.json({ error: message }, { status: 422 });
    }
  },
} satisfies ExportedHandler<Env>;
