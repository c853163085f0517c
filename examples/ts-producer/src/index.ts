// A producer Worker: a public endpoint that pushes one job to d1queue
// through its service binding and answers the job's id and state.
//
//   POST /   {"message": "hello", "unique_key": "order-7"}   (unique_key optional)
//
// The binding's type comes from @d1queue/types (clients/ts): a wrong call
// fails `tsc` (see wrong.ts), not the first request in production.
//
// Its URL is public, and it pushes with the d1queue Worker's full authority,
// so the caller chooses nothing but the message:
// - the job's name and queue are fixed here. A name taken from the request
//   would let anyone run any handler, http.request among them, which makes
//   the d1queue Worker send requests wherever D1QUEUE_HTTP_ALLOW permits;
// - the body is read from its stream up to MAX_BODY_BYTES and no further (a
//   chunked body states no length; request.json() would hold all of it);
// - it must be one flat object holding `message` and perhaps `unique_key`,
//   each of its type and size, and nothing else (no name, queue, payload,
//   delay_s...): anything else is a 4xx naming the problem, nothing pushed;
// - the answer holds the job's id and state, never its payload, and a
//   refusal from d1queue is logged, not passed on (it is for the operator).

import type { D1Queue, Job, JobState } from "@d1queue/types";

// A Worker module's exports are its handlers, functions, classes and types:
// workerd refuses a constant among them, so the constants stay unexported.

/** The one job this producer pushes. */
export type JobName = "example.echo";
const JOB: JobName = "example.echo";
/** The queue it pushes to. */
const QUEUE = "echo";
/** A request body: {"message": ..., "unique_key": ...} fits with room to spare. */
const MAX_BODY_BYTES = 1024;
const MAX_MESSAGE_CHARS = 200;
/** The caller's idempotency key: a retried request pushes the job once. */
const UNIQUE_KEY = /^[A-Za-z0-9_-]{1,64}$/;
const FIELDS = new Set(["message", "unique_key"]);

export interface Env {
  QUEUE: Service<D1Queue<JobName>>;
}

/** What a request asks for, once checked. */
export interface PushRequest {
  message: string;
  unique_key?: string;
}

export interface PushAnswer {
  id: string;
  deduplicated: boolean;
  state: JobState["state"];
}

/** A request this producer does not push: its status, code and message. */
export class Refused extends Error {
  constructor(
    readonly status: number,
    readonly code: string,
    message: string,
  ) {
    super(message);
  }

  response(headers: Record<string, string> = {}): Response {
    const error = { code: this.code, message: this.message };
    return Response.json({ error }, { status: this.status, headers });
  }
}

/** The body's bytes, read from its stream no further than `limit` (413 past it). */
export async function readBody(request: Request, limit: number): Promise<Uint8Array> {
  const tooLarge = new Refused(413, "payload_too_large", `the body exceeds ${limit} bytes`);
  if (Number(request.headers.get("content-length") ?? 0) > limit) throw tooLarge;
  if (request.body === null) return new Uint8Array();
  const reader = request.body.getReader();
  const chunks: Uint8Array[] = [];
  let size = 0;
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    size += value.byteLength;
    if (size > limit) {
      await reader.cancel();
      throw tooLarge;
    }
    chunks.push(value);
  }
  const body = new Uint8Array(size);
  let at = 0;
  for (const chunk of chunks) {
    body.set(chunk, at);
    at += chunk.byteLength;
  }
  return body;
}

/** The request a body holds, or Refused: a flat object of the expected fields. */
export function checked(body: Uint8Array): PushRequest {
  let parsed: unknown;
  try {
    // The size cap bounds the nesting JSON.parse can meet; the shape check
    // below then refuses any nesting at all.
    parsed = JSON.parse(new TextDecoder("utf-8", { fatal: true, ignoreBOM: false }).decode(body));
  } catch (error) {
    throw new Refused(400, "malformed_json", `the body is not valid JSON: ${String(error)}`);
  }
  if (typeof parsed !== "object" || parsed === null || Array.isArray(parsed)) {
    throw new Refused(400, "malformed_json", 'the body is a JSON object: {"message": "..."}');
  }
  const fields = parsed as Record<string, unknown>;
  const unknown = Object.keys(fields).filter((k) => !FIELDS.has(k)).sort();
  if (unknown.length > 0) {
    const names = unknown.join(", ");
    const message = `unknown field(s): ${names}; the body holds message and unique_key only`;
    throw new Refused(422, "invalid", message);
  }
  const { message, unique_key } = fields;
  if (typeof message !== "string" || message.length < 1 || message.length > MAX_MESSAGE_CHARS) {
    const rule = `message is a string of 1 to ${MAX_MESSAGE_CHARS} characters`;
    throw new Refused(422, "invalid", rule);
  }
  if (unique_key === undefined) return { message };
  if (typeof unique_key !== "string" || !UNIQUE_KEY.test(unique_key)) {
    throw new Refused(422, "invalid", `unique_key is a string matching ${UNIQUE_KEY.source}`);
  }
  return { message, unique_key };
}

export async function push(env: Env, request: PushRequest): Promise<PushAnswer> {
  const job: Job<JobName> = { name: JOB, payload: { message: request.message } };
  if (request.unique_key !== undefined) job.unique_key = request.unique_key;
  const pushed = await env.QUEUE.dispatch(QUEUE, job);
  const state = await env.QUEUE.job(pushed.id);
  return { id: pushed.id, deduplicated: pushed.deduplicated, state: state.state };
}

export default {
  async fetch(request: Request, env: Env): Promise<Response> {
    if (request.method !== "POST") {
      return new Refused(405, "method_not_allowed", "POST a job").response({ allow: "POST" });
    }
    let wanted: PushRequest;
    try {
      wanted = checked(await readBody(request, MAX_BODY_BYTES));
    } catch (error) {
      if (error instanceof Refused) return error.response();
      throw error;
    }
    try {
      const answer = await push(env, wanted);
      return Response.json(answer, { status: answer.deduplicated ? 200 : 201 });
    } catch (error) {
      // d1queue refused the job ("<code>: <message>"): for the operator's log.
      const message = error instanceof Error ? error.message : String(error);
      console.error(JSON.stringify({ event: "producer.refused", error: message }));
      return new Refused(502, "not_queued", "the job was not queued").response();
    }
  },
} satisfies ExportedHandler<Env>;
